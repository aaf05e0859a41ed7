package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// redisCPU reads what a Redis server has spent so far: the process' CPU
// (INFO cpu, user plus system) and the time its script commands ran with
// their number of calls (INFO commandstats, FCALL), in µs.
func redisCPU(ctx context.Context, c *redis.Client) (cpu, scripts float64, calls int64, err error) {
	cpu, n, scripts, err := redisstore.RedisInfo(ctx, c, "fcall", "fcall_ro")
	return cpu, scripts, int64(n), err
}

// BenchmarkRedisCPU is 64 goroutines deciding GCRA on distinct keys through
// a coalescing store, as deployed, and reports what Redis spends per
// decision: its process CPU (redis-cpu-µs/decision), the time its script
// commands ran (script-µs/decision, INFO commandstats) and the decisions
// each script call made (decisions/call). Run it with
//
//	go test -run '^$' -bench RedisCPU -benchtime 200000x ./redisstore/
func BenchmarkRedisCPU(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	admin := srv.Client()
	defer admin.Close()
	for _, alg := range contract.Algorithms {
		b.Run(string(alg), func(b *testing.B) {
			o := srv.Options()
			o.PoolSize = 128
			c := redis.NewClient(o)
			defer c.Close()
			l := redisstore.New(c, redisstore.Config{Coalescing: 4, Timeout: time.Second})
			p := ratelimit.Policy{Name: "cpu", Algorithm: alg, Limit: 1_000_000, Window: time.Second}
			ctx := context.Background()
			if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "warm"}); err != nil {
				b.Fatal(err)
			}
			cpu0, us0, calls0, err := redisCPU(ctx, admin)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			decideInParallel(b, l, p)
			b.StopTimer()
			cpu1, us1, calls1, err := redisCPU(ctx, admin)
			if err != nil {
				b.Fatal(err)
			}
			n := float64(b.N)
			b.ReportMetric((cpu1-cpu0)/n, "redis-cpu-µs/decision")
			b.ReportMetric((us1-us0)/n, "script-µs/decision")
			b.ReportMetric(n/float64(max(calls1-calls0, 1)), "decisions/call")
		})
	}
}
