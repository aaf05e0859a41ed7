package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
)

// redisInfo is what INFO cpu, stats and commandstats say of a Redis
// server: its process' CPU so far (user plus system, µs), the connections
// it has accepted, and each command's calls and µs by its name there
// ("evalsha", "script|load"; a script's own commands counted apart from
// it).
type redisInfo struct {
	cpuUS       float64
	connections int64
	commands    map[string]commandStat
}

type commandStat struct{ calls, us float64 }

func readRedisInfo(ctx context.Context, c *redis.Client) (redisInfo, error) {
	info, err := c.Info(ctx, "cpu", "stats", "commandstats").Result()
	if err != nil {
		return redisInfo{}, err
	}
	ri := redisInfo{commands: map[string]commandStat{}}
	for line := range strings.Lines(info) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			f, _ := strconv.ParseFloat(val, 64)
			ri.cpuUS += f * 1e6
			continue
		}
		if name == "total_connections_received" {
			ri.connections, _ = strconv.ParseInt(val, 10, 64)
			continue
		}
		command, ok := strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		var st commandStat
		for field := range strings.SplitSeq(val, ",") {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseFloat(v, 64)
			case "usec":
				st.us, _ = strconv.ParseFloat(v, 64)
			}
		}
		ri.commands[command] = st
	}
	return ri, nil
}

// processCPU is the CPU time c's Redis process has used so far, µs.
func processCPU(b *testing.B, c *redis.Client) float64 {
	ri, err := readRedisInfo(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return ri.cpuUS
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
	for _, alg := range contract.Algorithms {
		for _, mode := range []string{"single", "batch"} {
			b.Run(fmt.Sprint(alg, "/calls=", mode), func(b *testing.B) {
				c := redis.NewClient(srv.Options())
				defer c.Close()
				l := New(c, Config{})
				if err := l.Ping(context.Background()); err != nil {
					b.Fatal(err)
				}
				p := ratelimit.Policy{Name: "cpu-" + mode, Algorithm: alg, Limit: 1_000_000, Window: time.Second}
				reqs := make([]contract.Request, depth)
				ctx := context.Background()
				cpu0 := processCPU(b, admin)
				b.ResetTimer()
				for n := 0; n < b.N; n += depth {
					for i := range reqs {
						reqs[i] = contract.Request{Request: ratelimit.Request{Policy: p, Key: "k" + strconv.Itoa((n+i)%10_000), ID: "r" + strconv.Itoa(n+i)}}
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
							0, p.Limit, p.Window.Microseconds(), p.Capacity(), r.Units(), r.ID, 1, 1, l.resend)
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

// scriptStats reads INFO commandstats: the calls and µs of EVALSHA, and the
// µs of every other command (those the scripts called: TIME, HMGET, HSET...).
func scriptStats(b *testing.B, c *redis.Client) (calls, scriptUS, innerUS float64) {
	ri, err := readRedisInfo(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	for name, st := range ri.commands {
		switch name {
		case "evalsha":
			calls, scriptUS = st.calls, st.us
		case "config|resetstat", "info":
		default:
			innerUS += st.us
		}
	}
	return calls, scriptUS, innerUS
}

// BenchmarkScriptParts splits the time Redis spends running one decision
// script call (INFO commandstats) into its parts, one script per decision
// on distinct keys (pipelines of 16, one goroutine): calls=empty is a script
// that returns at once with the same arguments (what any EVALSHA costs);
// calls=prelude adds the GCRA script's helpers and the reading of its
// arguments, and returns (each helper is a closure made per call); then the
// whole decision script of each algorithm. script-µs/call is EVALSHA's time,
// commands-µs/call the part of it the commands the script called took
// themselves; the rest is Lua and the calls' crossing into Redis. Run it with
//
//	go test -run '^$' -bench ScriptParts -benchtime 96000x ./redisstore/
func BenchmarkScriptParts(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	admin := srv.Client()
	parts := []struct{ name, src string }{
		{"empty", "return 1"},
		{"prelude", arithLua + stateLua + decideLua + onceLua + argsLua + "return 1"},
	}
	for _, alg := range contract.Algorithms {
		parts = append(parts, struct{ name, src string }{string(alg), decideSrc[alg]})
	}
	const depth = 16
	for _, part := range parts {
		b.Run("calls="+part.name, func(b *testing.B) {
			ctx := context.Background()
			c := redis.NewClient(srv.Options())
			defer c.Close()
			l := New(c, Config{})
			script := redis.NewScript(part.src)
			if err := script.Load(ctx, c).Err(); err != nil {
				b.Fatal(err)
			}
			if err := admin.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			p := ratelimit.Policy{Name: "parts", Algorithm: ratelimit.GCRA, Limit: 1_000_000, Window: time.Second}
			if a := ratelimit.Algorithm(part.name); slices.Contains(contract.Algorithms, a) {
				p.Algorithm = a
			}
			b.ResetTimer()
			for n := 0; n < b.N; n += depth {
				pipe := c.Pipeline()
				for i := range depth {
					key := "k" + strconv.Itoa((n+i)%10_000)
					script.EvalSha(ctx, pipe, []string{l.Key(p, key)},
						0, p.Limit, p.Window.Microseconds(), p.Capacity(), 1, "r"+strconv.Itoa(n+i), 1, 1, l.resend)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			calls, scriptUS, innerUS := scriptStats(b, admin)
			if calls == 0 {
				b.Fatal("INFO commandstats counted no EVALSHA")
			}
			b.ReportMetric(scriptUS/calls, "script-µs/call")
			b.ReportMetric(innerUS/calls, "commands-µs/call")
		})
	}
}
