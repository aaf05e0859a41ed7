// Command bench measures the limiter beside its peers, in one run against
// one Redis (scripts/bench.sh starts a fresh redis-server and runs it; make
// bench):
//
//   - ours/<algorithm>: each algorithm through the limiter as deployed (the
//     resilient layer over redisstore, the service's client settings);
//   - ours-raw/gcra: GCRA on redisstore alone (what the resilient layer costs);
//   - peer/redis_rate: go-redis/redis_rate v10's GCRA;
//   - peer/ulule_limiter: ulule/limiter v3's fixed window on Redis;
//   - ceiling/redis-benchmark-P1 and -P16: redis-benchmark calling our own
//     GCRA function by FCALL, one command per round trip and 16 deep;
//   - script-cpu/*: one decision call's own Redis CPU (INFO commandstats),
//     our GCRA function beside redis_rate's script, over one connection;
//   - fallback/decision and fallback/decision-journal-file: the local decision
//     an instance makes while Redis is out, and the journaling of its grant;
//   - stack/*: a native stack through nginx: a route with the limiter (on
//     the keys, a signed API key each; and on one hot key, the client
//     address) and without it, and the doors for other languages beside them (a static
//     site behind auth_request, Envoy's rate limit service over gRPC);
//   - cluster/*: ours/gcra on the single Redis and on a Redis Cluster
//     (-cluster; scripts/bench.sh starts a native one of three masters),
//     in turns, with the Redis CPU a decision costs on each (cluster.go);
//   - memory/*: the Redis memory of a key of each algorithm and of
//     redis_rate's, from -mem-keys keys written into the flushed Redis
//     (memory.go).
//
// Each throughput row has decisions/s, p50 and p99 (µs) at 1, 16, 64 and
// 256 goroutines over 10 000 keys, and the CPU its Redis spent per
// decision; a row some of whose decisions were not made in Redis is marked,
// and is no ratio's input. It writes bench-out/results.json and
// docs/BENCHMARKS.md.
package main

// This file builds the rows (each a few lines that hand one limiter to the
// same measuring loop, job.go; cluster.go adds the cluster rows);
// ceiling.go, fallback.go and memory.go measure the rows that are not such
// a loop, and report.go writes the results.

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/lease"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/fleetlimit/fleetlimit/loadtest"
)

// Row is one measured line of results.json.
type Row struct {
	Name          string  `json:"name"`
	Goroutines    int     `json:"goroutines"`
	DecisionsPerS float64 `json:"decisions_per_s"`
	P50us         float64 `json:"p50_us"`
	P99us         float64 `json:"p99_us"`
	NsPerOp       float64 `json:"ns_per_op,omitempty"`
	AllocsPerOp   int64   `json:"allocs_per_op,omitempty"`
	HeapBytes     int64   `json:"heap_bytes,omitempty"`
	KeysHeld      int64   `json:"keys_held,omitempty"`
	// RedisCPUus is the CPU time Redis' process spent per decision over
	// the row's slices (INFO cpu), µs.
	RedisCPUus float64 `json:"redis_cpu_us_per_decision,omitempty"`
	// BenchCPUus is the CPU time this process spent per decision over the
	// row's slices, for the rows whose limiter runs in it (a library call):
	// the limiter's Go side and its Redis client, with the measuring loop,
	// µs.
	BenchCPUus float64 `json:"bench_cpu_us_per_decision,omitempty"`
	// NotInRedis counts the row's decisions not made in Redis (decided
	// locally, a cached refusal, a failed call): such a row is marked in
	// the table and is no ratio's input.
	NotInRedis int64 `json:"not_in_redis,omitempty"`
	// AppCPUus is, for a stack row, the CPU time the stack's app
	// instances spent per request (/proc/<pid>/stat), µs.
	AppCPUus float64 `json:"app_cpu_us_per_request,omitempty"`
	// PerRedisRead is, for a stack row, its requests per read event of
	// the stack's Redis (INFO stats total_reads_processed, heartbeats
	// included): how many decisions a round trip to Redis carries.
	PerRedisRead float64 `json:"requests_per_redis_read,omitempty"`
}

// suffix is what the row's line on the display adds to its rate and
// latencies.
func (r Row) suffix() string {
	s := ""
	if r.RedisCPUus > 0 {
		s += fmt.Sprintf("  Redis CPU %5.1f µs/decision", r.RedisCPUus)
	}
	if r.BenchCPUus > 0 {
		s += fmt.Sprintf("  bench CPU %5.1f µs/decision", r.BenchCPUus)
	}
	if r.AppCPUus > 0 {
		s += fmt.Sprintf("  apps CPU %5.1f µs/request", r.AppCPUus)
	}
	if r.PerRedisRead > 0 {
		s += fmt.Sprintf("  %4.1f requests/Redis read", r.PerRedisRead)
	}
	if r.NotInRedis > 0 {
		s += fmt.Sprintf("  (%d decisions not made in Redis)", r.NotInRedis)
	}
	return s
}

// Results is results.json.
type Results struct {
	Machine  string `json:"machine"`
	Redis    string `json:"redis"`
	Keys     int    `json:"keys"`
	Pool     int    `json:"pool"`
	Coalesce int    `json:"coalesce"`
	CellTime string `json:"cell_time"`
	Rounds   int    `json:"rounds"` // each row's cell is split in this many slices, taken in turns
	// CPUBusyPct and CPUStealPct are the machine's CPU use over the run
	// (percent of all cores' time): busy, and taken by the hypervisor. A
	// run with steal measured the host too; compare ratios within a run.
	CPUBusyPct  *float64 `json:"cpu_busy_pct,omitempty"`
	CPUStealPct *float64 `json:"cpu_steal_pct,omitempty"`
	Rows        []Row    `json:"rows"`
	// Memory is the Redis memory per key of each algorithm (memory.go).
	Memory []MemRow `json:"memory,omitempty"`
	// ScriptCPU is the Redis CPU of one decision call (scriptcpu.go).
	ScriptCPU []ScriptCPURow     `json:"script_cpu,omitempty"`
	Ratios    map[string]float64 `json:"ratios"`
}

const limit = 1000 // per second, per key: most calls are admissions

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	addr := fs.String("redis", "127.0.0.1:6379", "a fresh Redis to measure against")
	cell := fs.Duration("cell", 3*time.Second, "how long each row is measured")
	rounds := fs.Int("rounds", 3, "each row is measured in this many slices of -cell, the rows taking turns, so a host that slows down during the run slows every row alike")
	keys := fs.Int("keys", 10_000, "distinct keys")
	levels := fs.String("goroutines", "1,16,64,256", "concurrency levels")
	pool := fs.Int("pool", 300, "go-redis pool size, on every side")
	coalesce := fs.Int("coalesce", 4, "our pipelines in flight at once (RL_REDIS_PIPELINES; 0: a round trip per decision)")
	only := fs.String("only", "", "measure only the rows whose name starts with this (memory/: only the memory rows; cluster/: only the cluster rows)")
	memKeys := fs.Int("mem-keys", 200_000, "distinct keys each memory row writes (Redis bytes per key of each algorithm; it flushes the Redis); 0 leaves the memory rows out")
	clusterAddrs := fs.String("cluster", "", "the nodes of a Redis Cluster (host:port,...): measure ours/gcra on it beside the single Redis, in turns (cluster/* rows)")
	stackURL := fs.String("stack", "", "nginx of a native stack serving /api/bench-on (limited) and /api/bench-off (not): measure the stack with the limiter on and off")
	stackPids := fs.String("stack-pids", "", "with -stack: the pids of its app instances (comma separated), whose CPU per request the stack rows report")
	stackRedis := fs.String("stack-redis", "", "with -stack: the stack's Redis (host:port; its password, if any, in $STACK_REDIS_PASSWORD), whose CPU the stack rows report")
	apiKeySecret := fs.String("api-key-secret", cmp.Or(os.Getenv("RL_API_KEY_SECRET"), loadtest.DemoAPIKeySecret), "with -stack: the secret the stack checks API keys with (the stack rows send a signed key per client)")
	rlsAddr := fs.String("rls", "", "with -stack: its rate limit service (domain bench, descriptor key), and /static/ behind auth_request: measure the doors beside the route")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	out := fs.String("out", "bench-out/results.json", "results file")
	md := fs.String("md", "docs/BENCHMARKS.md", "the table, rendered")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lv := newLive()
	lv.prog.Start()
	defer lv.prog.Stop()
	cpuStart, cpuOK := loadtest.ReadCPU()
	stopProfile, err := loadtest.StartCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	var gs []int
	for f := range strings.SplitSeq(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-goroutines: %q", f)
		}
		gs = append(gs, n)
	}
	cc := redisstore.ClientConfig{Addrs: []string{*addr}, Timeout: 50 * time.Millisecond, PoolSize: *pool}
	client, err := redisstore.NewClient(cc)
	if err != nil {
		return err
	}
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s: %w", *addr, err)
	}
	res := Results{Machine: fmt.Sprintf("%s/%s, %d CPUs, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version()),
		Redis: redisVersion(ctx, client), Keys: *keys, Pool: *pool, Coalesce: *coalesce, CellTime: cell.String(), Rounds: *rounds, Ratios: map[string]float64{}}
	names := make([]string, *keys)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}

	if *rounds < 1 {
		return fmt.Errorf("-rounds: %d", *rounds)
	}
	// wants reports whether -only selects the rows under prefix.
	wants := func(prefix string) bool {
		return strings.HasPrefix(prefix, *only) || strings.HasPrefix(*only, prefix)
	}
	var jobs []*job
	add := func(name string, g int, d decider, src source) {
		if strings.HasPrefix(name, *only) {
			jobs = append(jobs, &job{name: name, g: g, d: d, src: src, live: lv})
		}
	}
	// measureAll measures the jobs added so far, in turns, and adds their
	// rows.
	measureAll := func(what string, between func() error) error {
		if len(jobs) == 0 && between == nil {
			return nil
		}
		for r := range *rounds {
			lv.prog.Phase(fmt.Sprintf("%s, round %d of %d", what, r+1, *rounds))
			for _, j := range jobs {
				j.run(ctx, *cell/time.Duration(*rounds), names, r == 0)
			}
			if between != nil {
				if err := between(); err != nil {
					return err
				}
			}
		}
		lv.prog.Phase("") // the last round's line before the rows
		for _, j := range jobs {
			res.Rows = append(res.Rows, j.row())
		}
		jobs = nil
		return nil
	}

	rs := redisstore.New(client, redisstore.Config{Timeout: 50 * time.Millisecond, Coalescing: *coalesce})
	// The memory rows first, on the fresh Redis (they flush it, so they run
	// before any limiter of the rows below keeps fleet state in it).
	if *memKeys > 0 && wants("memory/") {
		if res.Memory, err = memoryRows(ctx, *addr, client, rs, *memKeys, *only, lv); err != nil {
			return err
		}
	}

	// A decision call's own Redis CPU, ours beside redis_rate's, while
	// nothing else runs.
	if wants("script-cpu/") {
		lv.prog.Phase("script CPU, redis-benchmark")
		if res.ScriptCPU, err = scriptCPURows(ctx, *addr, client); err != nil {
			return err
		}
		lv.prog.Phase("")
		for _, r := range res.ScriptCPU {
			fmt.Fprintf(display, "%-36s %s µs per call %v\n", r.Name, strings.ToUpper(r.Command), r.Rounds)
		}
	}

	// Ours, as deployed: resilient over redisstore, the service's settings.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	lim, err := resilient.New(rs, resilient.Config{Instance: "bench", Logger: quiet})
	if err != nil {
		return err
	}
	defer lim.Close(ctx)
	// Ours decides elsewhere than Redis when the fallback decides (a call
	// failed or timed out) and when a refusal is cached.
	ours := source{redis: client, inProcess: true, elsewhere: func() int64 {
		st := lim.Status()
		return int64(st.LocalDecisions + st.CachedRefusals)
	}}
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.TokenBucket, ratelimit.SlidingWindowCounter, ratelimit.SlidingWindowLog} {
		p := ratelimit.Policy{Name: "bench-" + string(alg), Algorithm: alg, Limit: limit, Window: time.Second}
		d := func(ctx context.Context, key string) error {
			_, err := lim.Decide(ctx, ratelimit.Request{Policy: p, Key: key})
			return err
		}
		for _, g := range gs {
			add("ours/"+string(alg), g, d, ours)
		}
	}
	// One hot key under a policy it never refuses (as the stack rows'),
	// decided in Redis every time (ours/gcra-hot) and in lease mode
	// (ours/gcra-lease-hot: the lease layer over the same limiter, as the
	// service deploys it). A lease's units are counted in Redis when it is
	// taken, so its answers count as Redis' decisions.
	leased := lease.New(lim, lease.Config{Instance: "bench"})
	defer leased.Close(ctx)
	{
		const hot = 100_000_000
		p := ratelimit.Policy{Name: "bench-hot", Algorithm: ratelimit.GCRA, Limit: hot, Window: time.Second}
		lp := ratelimit.Policy{Name: "bench-lease", Algorithm: ratelimit.GCRA, Limit: hot, Window: time.Second, Lease: 50 * time.Millisecond}
		for _, g := range gs {
			add("ours/gcra-hot", g, func(ctx context.Context, _ string) error {
				_, err := lim.Decide(ctx, ratelimit.Request{Policy: p, Key: "hot"})
				return err
			}, ours)
			add("ours/gcra-lease-hot", g, func(ctx context.Context, _ string) error {
				_, err := leased.Decide(ctx, ratelimit.Request{Policy: lp, Key: "hot"})
				return err
			}, ours)
		}
	}
	// Our GCRA on redisstore alone, without the fault-tolerance layer: what
	// that layer costs.
	{
		p := ratelimit.Policy{Name: "bench-raw", Algorithm: ratelimit.GCRA, Limit: limit, Window: time.Second}
		for _, g := range gs {
			add("ours-raw/gcra", g, func(ctx context.Context, key string) error {
				_, err := rs.Decide(ctx, ratelimit.Request{Policy: p, Key: key})
				return err
			}, source{redis: client, inProcess: true})
		}
	}

	// The peers, on a client with the same settings.
	rr := redis_rate.NewLimiter(client)
	for _, g := range gs {
		add("peer/redis_rate", g, func(ctx context.Context, key string) error {
			_, err := rr.Allow(ctx, key, redis_rate.PerSecond(limit))
			return err
		}, source{redis: client, inProcess: true})
	}
	ustore, err := ululeredis.NewStoreWithOptions(client, ulule.StoreOptions{Prefix: "ulule", MaxRetry: 1})
	if err != nil {
		return err
	}
	ul := ulule.New(ustore, ulule.Rate{Period: time.Second, Limit: limit})
	for _, g := range gs {
		add("peer/ulule_limiter", g, func(ctx context.Context, key string) error {
			_, err := ul.Get(ctx, key)
			return err
		}, source{redis: client, inProcess: true})
	}

	// The ceiling: our GCRA script by redis-benchmark, 64 connections, a
	// slice after each round of the rows above.
	var ceil [2][]Row
	var between func() error
	if wants("ceiling/") {
		between = func() error {
			for i, depth := range []int{1, 16} {
				r, err := ceiling(ctx, client, *addr, depth, *keys, 300_000 / *rounds)
				if err != nil {
					return err
				}
				ceil[i] = append(ceil[i], r)
			}
			return nil
		}
	}
	if err := measureAll("libraries", between); err != nil {
		return err
	}
	if s := lim.Status(); s.LocalDecisions > 0 {
		fmt.Fprintf(os.Stderr, "bench: warning: %d of our decisions were made locally (store calls failed or timed out)\n", s.LocalDecisions)
	}
	for _, sl := range ceil {
		if len(sl) > 0 {
			res.Rows = append(res.Rows, sumCeiling(sl))
		}
	}

	// The fallback's decision and the journal's append, in memory.
	if wants("fallback/") {
		lv.prog.Phase("fallback")
		res.Rows = append(res.Rows, fallbackRows(quiet)...)
		lv.prog.Phase("")
	}

	// Our GCRA on a Redis Cluster beside the single Redis, in turns: the
	// Redis CPU a decision costs on each.
	if *clusterAddrs != "" && wants("cluster/") {
		stop, err := clusterRows(ctx, clusterSetup{
			addrs: strings.Split(*clusterAddrs, ","), pool: *pool, coalesce: *coalesce, logger: quiet,
			single: lim, singleSrc: ours, levels: gs, add: add,
		})
		if err != nil {
			return err
		}
		defer stop()
		if err := measureAll("cluster", nil); err != nil {
			return err
		}
	}

	// The whole stack through nginx, the same route with the limiter and
	// without it. A response's X-RateLimit-Mode (the stack sends debug
	// headers) says where its decision was made.
	if *stackURL != "" {
		var src source
		if *stackRedis != "" {
			sc := redis.NewClient(&redis.Options{Addr: *stackRedis, Password: os.Getenv("STACK_REDIS_PASSWORD"), DisableIdentity: true})
			if err := sc.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("-stack-redis %s: %w", *stackRedis, err)
			}
			defer sc.Close()
			src.redis = sc
		}
		if src.apps, err = parsePids(*stackPids); err != nil {
			return err
		}
		var elsewhere atomic.Int64
		src.elsewhere = elsewhere.Load
		// Each of the keys a client of its own (a signed API key), but
		// for limiter-on-hot: every request the one client address.
		signed := make(map[string]string, len(names))
		for _, n := range names {
			if signed[n], err = loadtest.SignKey(*apiKeySecret, n); err != nil {
				return err
			}
		}
		deciders := map[string]decider{
			"limiter-off":    httpDecider(*stackURL+"/api/bench-off", signed, &elsewhere),
			"limiter-on":     httpDecider(*stackURL+"/api/bench-on", signed, &elsewhere),
			"limiter-on-hot": httpDecider(*stackURL+"/api/bench-on", nil, &elsewhere),
			"lease-hot":      httpDecider(*stackURL+"/api/bench-lease", nil, &elsewhere),
		}
		if *rlsAddr != "" {
			rls, err := loadtest.DialRLS(*rlsAddr)
			if err != nil {
				return err
			}
			defer rls.Close()
			deciders["auth-request"] = httpDecider(*stackURL+"/static/", signed, &elsewhere)
			deciders["grpc"] = rlsDecider(rls, loadtest.RLSPrefix+"bench/key")
		}
		for _, route := range []string{"limiter-off", "limiter-on", "limiter-on-hot", "lease-hot", "auth-request", "grpc"} {
			d, ok := deciders[route]
			if !ok {
				continue
			}
			for _, g := range gs {
				if g >= 16 {
					add("stack/"+route, g, d, src)
				}
			}
		}
		if err := measureAll("stack", nil); err != nil {
			return err
		}
	}

	if end, ok := loadtest.ReadCPU(); ok && cpuOK {
		if busy, steal := loadtest.CPUPercents(cpuStart, end); !math.IsNaN(busy) {
			res.CPUBusyPct, res.CPUStealPct = &busy, &steal
			fmt.Fprintf(display, "machine CPU over the run: busy %.1f%%, steal %.1f%%\n", busy, steal)
		}
	}
	ratios(&res)
	if err := write(*out, *md, res); err != nil {
		return err
	}
	fmt.Fprintf(display, "bench: wrote %s and %s\n", *out, *md)
	return nil
}
