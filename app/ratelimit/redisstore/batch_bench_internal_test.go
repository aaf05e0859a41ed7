package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
)

// processCPU is the CPU time c's Redis process has used so far, µs.
func processCPU(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var us float64
	for line := range strings.Lines(info) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(val, 64)
			us += f * 1e6
		}
	}
	return us
}

// BenchmarkScriptCPU sends the same decisions (distinct keys, pipelines of
// 16, one goroutine) as one script call each (calls=single) or one batch
// script call per pipeline (calls=batch), and reports the CPU Redis' process
// spent per decision: what the batch script saves Redis, apart from the
// client's coalescing. Run it with
//
//	go test -run '^$' -bench ScriptCPU -benchtime 100000x ./redisstore/
func BenchmarkScriptCPU(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	admin := srv.Client()
	const depth = 16
	for _, alg := range ratelimit.Algorithms {
		for _, mode := range []string{"single", "batch"} {
			b.Run(fmt.Sprint(alg, "/calls=", mode), func(b *testing.B) {
				c := redis.NewClient(srv.Options())
				defer c.Close()
				l := New(c)
				if err := l.Ping(context.Background()); err != nil {
					b.Fatal(err)
				}
				p := ratelimit.Policy{Name: "cpu-" + mode, Algorithm: alg, Limit: 1_000_000, Window: time.Second}
				reqs := make([]ratelimit.Request, depth)
				ctx := context.Background()
				cpu0 := processCPU(b, admin)
				b.ResetTimer()
				for n := 0; n < b.N; n += depth {
					for i := range reqs {
						reqs[i] = ratelimit.Request{Policy: p, Key: "k" + strconv.Itoa((n+i)%10_000), ID: "r" + strconv.Itoa(n+i)}
					}
					if mode == "batch" {
						_, errs := l.pipeline(ctx, reqs)
						for _, err := range errs {
							if err != nil {
								b.Fatal(err)
							}
						}
						continue
					}
					pipe := c.Pipeline()
					for _, r := range reqs {
						scripts[alg].EvalSha(ctx, pipe, []string{l.Key(p, r.Key)},
							0, p.Limit, p.WindowMicros(), p.Capacity(), r.Units(), r.ID, 0, 0, l.resend)
					}
					if _, err := pipe.Exec(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric((processCPU(b, admin)-cpu0)/float64(b.N), "redis-cpu-µs/decision")
			})
		}
	}
}
