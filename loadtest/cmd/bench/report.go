package main

// The ratios of a run, and results.json and docs/BENCHMARKS.md written
// from its rows.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// find returns the row name at g goroutines (any, for g 0), unless some of
// its decisions were not made in Redis: such a row is no ratio's input.
func find(res Results, name string, g int) *Row {
	for i, r := range res.Rows {
		if r.Name == name && (g == 0 || r.Goroutines == g) && r.NotInRedis == 0 {
			return &res.Rows[i]
		}
	}
	return nil
}

// ratios compares rows of this run.
func ratios(res *Results) {
	ours, peer := find(*res, "ours/gcra", 64), find(*res, "peer/redis_rate", 64)
	if ours != nil && peer != nil && peer.DecisionsPerS > 0 {
		res.Ratios["ours_vs_redis_rate_at_64"] = round(ours.DecisionsPerS/peer.DecisionsPerS*100) / 100
	}
	if ours != nil && ours.RedisCPUus > 0 { // the target is a figure, not a ratio: µs
		res.Ratios["ours_gcra_redis_cpu_us_per_decision_at_64"] = ours.RedisCPUus
	}
	for _, g := range []int{1, 64} {
		exact, leased := find(*res, "ours/gcra-hot", g), find(*res, "ours/gcra-lease-hot", g)
		if exact != nil && leased != nil && exact.DecisionsPerS > 0 {
			res.Ratios[fmt.Sprintf("ours_lease_hot_vs_exact_hot_at_%d", g)] = round(leased.DecisionsPerS/exact.DecisionsPerS*100) / 100
		}
	}
	ours1, peer1 := find(*res, "ours/gcra", 1), find(*res, "peer/redis_rate", 1)
	if ours1 != nil && peer1 != nil && peer1.P50us > 0 {
		res.Ratios["ours_p50_vs_redis_rate_at_1"] = round(ours1.P50us/peer1.P50us*100) / 100
	}
	for _, g := range []int{16, 64, 256} {
		on, off := find(*res, "stack/limiter-on", g), find(*res, "stack/limiter-off", g)
		if on != nil && off != nil && off.DecisionsPerS > 0 {
			res.Ratios[fmt.Sprintf("stack_on_vs_off_at_%d", g)] = round(on.DecisionsPerS/off.DecisionsPerS*100) / 100
		}
		if hot := find(*res, "stack/limiter-on-hot", g); hot != nil && off != nil && off.DecisionsPerS > 0 {
			res.Ratios[fmt.Sprintf("stack_on_hot_vs_off_at_%d", g)] = round(hot.DecisionsPerS/off.DecisionsPerS*100) / 100
		}
		if hot := find(*res, "stack/lease-hot", g); hot != nil && off != nil && off.DecisionsPerS > 0 {
			res.Ratios[fmt.Sprintf("stack_lease_hot_vs_off_at_%d", g)] = round(hot.DecisionsPerS/off.DecisionsPerS*100) / 100
		}
		for _, door := range []string{"auth-request", "grpc"} {
			if d := find(*res, "stack/"+door, g); d != nil && on != nil && on.DecisionsPerS > 0 {
				res.Ratios[fmt.Sprintf("stack_%s_vs_on_at_%d", strings.ReplaceAll(door, "-", "_"), g)] = round(d.DecisionsPerS/on.DecisionsPerS*100) / 100
			}
		}
	}
	if c := find(*res, "ceiling/redis-benchmark-P16", 0); c != nil && c.DecisionsPerS > 0 {
		best := 0.0
		for _, r := range res.Rows {
			if r.Name == "ours/gcra" && r.NotInRedis == 0 {
				best = max(best, r.DecisionsPerS)
			}
		}
		res.Ratios["ours_gcra_best_vs_ceiling_P16"] = round(best/c.DecisionsPerS*100) / 100
	}
	clusterRatios(res)
	costRatios(res)
}

// costRatios are the cost of a decision beside the peer's: a decision
// call's own Redis CPU, Redis memory per key, and the CPU the limiter adds
// to a request of the stack (apps and Redis).
func costRatios(res *Results) {
	mean := func(v []float64) float64 {
		s := 0.0
		for _, x := range v {
			s += x
		}
		return s / float64(max(1, len(v)))
	}
	for _, depth := range []int{1, 16} {
		var ours, peer float64
		for _, r := range res.ScriptCPU {
			switch r.Name {
			case fmt.Sprintf("script-cpu/ours-gcra-P%d", depth):
				ours = mean(r.Rounds)
			case fmt.Sprintf("script-cpu/peer-redis_rate-P%d", depth):
				peer = mean(r.Rounds)
			}
		}
		if ours > 0 && peer > 0 {
			res.Ratios[fmt.Sprintf("script_cpu_ours_vs_redis_rate_P%d", depth)] = round(ours/peer*100) / 100
		}
	}
	mem := map[string]float64{}
	for _, m := range res.Memory {
		mem[m.Name] = m.UsedMemoryPerKey
	}
	for _, alg := range []string{"gcra", "token_bucket"} {
		if b := mem["memory/ours/"+alg]; b > 0 { // a figure, not a ratio: bytes
			res.Ratios["memory_"+alg+"_bytes_per_key"] = round(b)
			if p := mem["memory/peer/redis_rate"]; p > 0 {
				res.Ratios["memory_"+alg+"_vs_redis_rate"] = round(b/p*100) / 100
			}
		}
	}
	for _, g := range []int{16, 64, 256} {
		on, off := find(*res, "stack/limiter-on", g), find(*res, "stack/limiter-off", g)
		if on != nil && off != nil && on.AppCPUus > 0 && off.AppCPUus > 0 { // µs
			res.Ratios[fmt.Sprintf("stack_limiter_cpu_us_per_request_at_%d", g)] = round(on.AppCPUus + on.RedisCPUus - off.AppCPUus - off.RedisCPUus)
		}
	}
}

func write(out, md string, res Results) error {
	for _, p := range []string{out, md} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
	}
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\nWritten by `make bench` (scripts/bench.sh, loadtest/cmd/bench) on %s; %s; %d keys, %s per row, every row against the same fresh redis-server in one run, measured in %d slices with the rows taking turns (so a host that slows down during the run slows every row alike). The raw figures are in `bench-out/results.json`.\n\n",
		time.Now().UTC().Format("2006-01-02"), res.Machine, res.Keys, res.CellTime, res.Rounds)
	if res.CPUStealPct != nil {
		fmt.Fprintf(&b, "Over the run the machine's cores were %.1f %% busy and the hypervisor took %.1f %% of their time (steal): with steal, every row is slower, so compare rows of one run only.\n\n", *res.CPUBusyPct, *res.CPUStealPct)
	}
	fmt.Fprintf(&b, "Each row is one limiter or command at one concurrency: `ours/*` is our limiter as the service deploys it (the resilient layer over redisstore, 50 ms timeout) with `RL_REDIS_PIPELINES=%d` (`-coalesce`), on distinct keys, or on one hot key (a GCRA policy it never refuses) decided in Redis every time (`ours/gcra-hot`) and in lease mode (`ours/gcra-lease-hot`: 50 ms leases; a lease's units are counted in Redis when it is taken, so its answers count as decided in Redis, and the Redis CPU per decision is the draws' spread over the answers), `peer/*` the peer libraries (every side on one go-redis client of %d connections), `ceiling/*` redis-benchmark calling our own GCRA decision function by FCALL (64 connections, 1 and 16 commands per round trip), `fallback/*` the in-memory decision an instance makes while Redis is out and the journaling of its grant, `stack/*` the native stack (nginx, four instances, Redis; the apps dial Redis directly, log at info) answering one route with its limiter (a GCRA policy it never refuses) and without (a route with no policies), requests per second through nginx over keep-alive connections, each request as one of the keys (a signed API key each, so a decision per key: `stack/limiter-on`), or every request as the one client address (one hot key: `stack/limiter-on-hot`, and on a route whose GCRA policy is in lease mode with 50 ms leases: `stack/lease-hot`); beside them the doors for other languages through the same nginx and instances (docs/DOORS.md): `stack/auth-request` a static site (a second nginx) whose every request nginx first checks with an instance (auth_request, a GCRA policy it never refuses), `stack/grpc` Envoy's rate limit service (ShouldRateLimit over one plaintext HTTP/2 connection, a descriptor per key, GCRA); `cluster/*` `ours/gcra` on the single Redis (`cluster/gcra-single`) and on a native Redis Cluster beside it (`cluster/gcra-<n>-masters`: n masters without replicas on this machine, a Cluster client with the same settings; `BENCH_CLUSTER=0` leaves them out), measured in turns: `cluster_vs_single_decisions_per_redis_cpu_s_at_<g>` is the Cluster's decisions per Redis CPU-second (summed over its masters) over the single Redis'. The load generator and Redis share the machine's cores.\n\n", res.Coalesce, res.Pool)
	var mem strings.Builder
	b.WriteString("`Redis CPU µs` is the CPU time the Redis process spent per decision over the row (INFO cpu before and after each slice; for `stack/*` the stack's own Redis, heartbeats included; for a Cluster the sum over its masters): 10⁶ / µs is the decisions per second one fully busy Redis core makes. `bench CPU µs` is the CPU time the bench process spent per decision, for the rows whose limiter runs in it: the limiter's Go side and its Redis client, with the measuring loop. For `stack/*`, `apps CPU µs` is the CPU time the four app instances spent per request (/proc/<pid>/stat; nginx and Redis not included), and `per Redis read` the requests per read event of the stack's Redis (INFO stats `total_reads_processed`, heartbeats included): how many decisions one round trip to Redis carries. A row marked `not in Redis: n` had n decisions made elsewhere (by the fallback after a failed or timed-out call, from a cached refusal, or failed): its figures mix two paths, and it is no ratio's input.\n\n")
	b.WriteString("| row | goroutines | decisions/s | p50 µs | p99 µs | Redis CPU µs | bench CPU µs | apps CPU µs | per Redis read | ns/op | allocs/op |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range res.Rows {
		p50, p99, ns, allocs := fmt.Sprintf("%.1f", r.P50us), fmt.Sprintf("%.1f", r.P99us), "", ""
		if r.NsPerOp > 0 { // a Go benchmark: ns/op, not a latency distribution
			p50, p99, ns, allocs = "", "", fmt.Sprint(r.NsPerOp), fmt.Sprint(r.AllocsPerOp)
		}
		if r.HeapBytes != 0 {
			p50, p99 = "", ""
			fmt.Fprintf(&mem, "- `%s`: %d keys held locally (the key capacity) after 1 000 000 distinct keys were decided; the heap grew by %.0f MiB.\n", r.Name, r.KeysHeld, float64(r.HeapBytes)/(1<<20))
		}
		name, cpu, bcpu := r.Name, "", ""
		if r.NotInRedis > 0 {
			name += fmt.Sprintf(" (not in Redis: %d)", r.NotInRedis)
		}
		if r.RedisCPUus > 0 {
			cpu = fmt.Sprintf("%.1f", r.RedisCPUus)
		}
		if r.BenchCPUus > 0 {
			bcpu = fmt.Sprintf("%.1f", r.BenchCPUus)
		}
		acpu, perRead := "", ""
		if r.AppCPUus > 0 {
			acpu = fmt.Sprintf("%.1f", r.AppCPUus)
		}
		if r.PerRedisRead > 0 {
			perRead = fmt.Sprintf("%.1f", r.PerRedisRead)
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, r.Goroutines, r.DecisionsPerS, p50, p99, cpu, bcpu, acpu, perRead, ns, allocs)
	}
	if mem.Len() > 0 {
		b.WriteString("\nThe fallback's memory:\n\n" + mem.String())
	}
	b.WriteString(memoryText(res.Memory))
	b.WriteString(scriptCPUText(res.ScriptCPU))
	b.WriteString(sizingText(res))
	b.WriteString("\n## Ratios, same run\n\n| ratio | value |\n| --- | ---: |\n")
	keys := make([]string, 0, len(res.Ratios))
	for k := range res.Ratios {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s | %.2f |\n", k, res.Ratios[k])
	}
	b.WriteString("\nReproduce: `make bench` (it starts its own redis-server on a free port; `BENCH_ARGS=\"-cell 5s\"` passes flags to loadtest/cmd/bench).\n")
	return os.WriteFile(md, []byte(b.String()), 0o644)
}

func redisVersion(ctx context.Context, c redis.UniversalClient) string {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "unknown"
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			return "redis " + strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// sizingText is BENCHMARKS.md's sizing, worked from this run's rows by
// the method of docs/SCALING.md: Redis masters kept at most 60 % busy,
// Redis memory for 10 million users of one GCRA policy, and the limiter's
// own app CPU, at two loads.
func sizingText(res Results) string {
	cpu := find(res, "cluster/gcra-3-masters", 64)
	memKeys, memB := int64(0), 0.0
	for _, m := range res.Memory {
		if m.Name == "memory/ours/gcra" {
			memKeys, memB = m.Keys, m.UsedMemoryPerKey
		}
	}
	if cpu == nil || cpu.RedisCPUus <= 0 || memB <= 0 {
		return ""
	}
	// The keyspace and expires tables at 10 million keys hold 2^24
	// buckets of 8 B each: about 27 B/key for the two, 6 more than at a
	// few hundred thousand keys; a Cluster master keeps each key in its
	// slot's list, about 16 B more.
	perUser := memB + 16
	if memKeys < 4_000_000 {
		perUser += 6
	}
	s := "\n## Sizing from this run\n\n" +
		"docs/SCALING.md's method with this run's figures: Redis CPU per decision of `cluster/gcra-3-masters` at 64 goroutines (" +
		fmt.Sprintf("%.1f µs", cpu.RedisCPUus) + "), masters kept at most 60 % busy; `memory/ours/gcra` (" + fmt.Sprintf("%.1f B/key", memB) +
		") plus 16 B for a Cluster master's slot lists"
	if memKeys < 4_000_000 {
		s += " and 6 B for the larger tables at 10 million keys"
	}
	s += fmt.Sprintf(", %.0f B per user and policy; the limiter's own CPU in the app (bench CPU of the same row, %.1f µs; HTTP serving comes on top).\n\n", perUser, cpu.BenchCPUus)
	s += "| load | Redis masters (60 % busy) | Redis memory, 10 M users, GCRA | app CPU, limiter only |\n| --- | ---: | ---: | ---: |\n"
	for _, load := range []float64{100_000, 1_000_000} {
		cores := load * cpu.RedisCPUus / 1e6
		masters := int(math.Ceil(cores / 0.6))
		gb := 10e6 * perUser / 1e9
		s += fmt.Sprintf("| %.0f decisions/s | %.1f cores: %d masters | %.1f GB: %.0f MB per master | %.1f cores |\n",
			load, cores, masters, gb, gb*1000/float64(masters), load*cpu.BenchCPUus/1e6)
	}
	return s
}
