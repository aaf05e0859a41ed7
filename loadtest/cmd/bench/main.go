// Command bench measures the limiter beside its peers, in one run against
// one Redis (scripts/bench.sh starts a fresh redis-server and runs it; make
// bench):
//
//   - ours/<algorithm>: each algorithm through the limiter as deployed (the
//     resilient layer over redisstore, the service's client settings);
//   - ours-raw/gcra: GCRA on redisstore alone (what the resilient layer costs);
//   - peer/redis_rate: go-redis/redis_rate v10's GCRA;
//   - peer/ulule_limiter: ulule/limiter v3's fixed window on Redis;
//   - ceiling/redis-benchmark-P1 and -P16: redis-benchmark running our own
//     GCRA script by EVALSHA, one command per round trip and 16 deep;
//   - fallback/decision and fallback/journal-append: the in-memory decision
//     an instance makes while Redis is out, and the journaling of its grant;
//   - stack/*: a native stack through nginx: a route with the limiter and
//     without it, and the doors for other languages beside them (a static
//     site behind auth_request, Envoy's rate limit service over gRPC).
//
// Each row has decisions/s, p50 and p99 (µs) at 1, 16, 64 and 256
// goroutines over 10 000 keys. It writes bench-out/results.json and
// docs/BENCHMARKS.md.
package main

// The file is one piece: each row is a few lines that build one limiter and
// hand it to the same measuring loop, and the table is written from the
// same rows; split, a row would be spread over files.

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/journal"
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
	CPUBusyPct  *float64           `json:"cpu_busy_pct,omitempty"`
	CPUStealPct *float64           `json:"cpu_steal_pct,omitempty"`
	Rows        []Row              `json:"rows"`
	Ratios      map[string]float64 `json:"ratios"`
}

// decider is one decision against some limiter.
type decider func(ctx context.Context, key string) error

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
	only := fs.String("only", "", "measure only the rows whose name starts with this")
	stackURL := fs.String("stack", "", "nginx of a native stack serving /api/bench-on (limited) and /api/bench-off (not): measure the stack with the limiter on and off")
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
	opts, err := cc.Options()
	if err != nil {
		return err
	}
	client := redis.NewUniversalClient(opts)
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
	var jobs []*job
	add := func(name string, g int, d decider) {
		if strings.HasPrefix(name, *only) {
			jobs = append(jobs, &job{name: name, g: g, d: d, live: lv})
		}
	}
	// measureAll measures the jobs added so far, in turns, and adds their
	// rows.
	measureAll := func(what string, between func() error) error {
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

	// Ours, as deployed: resilient over redisstore, the service's settings.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := redisstore.New(client, redisstore.WithTimeout(50*time.Millisecond), redisstore.WithCoalescing(*coalesce))
	lim, err := resilient.New(store, resilient.Config{Instance: "bench", Logger: quiet})
	if err != nil {
		return err
	}
	defer lim.Close(ctx)
	for _, alg := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.TokenBucket, ratelimit.SlidingWindowCounter, ratelimit.SlidingWindowLog} {
		p := ratelimit.Policy{Name: "bench-" + string(alg), Algorithm: alg, Limit: limit, Window: time.Second}
		d := func(ctx context.Context, key string) error {
			_, err := lim.Decide(ctx, ratelimit.Request{Policy: p, Key: key})
			return err
		}
		for _, g := range gs {
			add("ours/"+string(alg), g, d)
		}
	}
	// Our GCRA on redisstore alone, without the fault-tolerance layer: what
	// that layer costs.
	{
		p := ratelimit.Policy{Name: "bench-raw", Algorithm: ratelimit.GCRA, Limit: limit, Window: time.Second}
		for _, g := range gs {
			add("ours-raw/gcra", g, func(ctx context.Context, key string) error {
				_, err := store.Decide(ctx, ratelimit.Request{Policy: p, Key: key})
				return err
			})
		}
	}

	// The peers, on a client with the same settings.
	rr := redis_rate.NewLimiter(client)
	for _, g := range gs {
		add("peer/redis_rate", g, func(ctx context.Context, key string) error {
			_, err := rr.Allow(ctx, key, redis_rate.PerSecond(limit))
			return err
		})
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
		})
	}

	// The ceiling: our GCRA script by redis-benchmark, 64 connections, a
	// slice after each round of the rows above.
	var ceil [2][]Row
	between := func() error {
		if !strings.HasPrefix("ceiling/", *only) && !strings.HasPrefix(*only, "ceiling/") {
			return nil
		}
		for i, depth := range []int{1, 16} {
			r, err := ceiling(ctx, client, *addr, depth, *keys, 300_000 / *rounds)
			if err != nil {
				return err
			}
			ceil[i] = append(ceil[i], r)
		}
		return nil
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
	if strings.HasPrefix("fallback/", *only) || strings.HasPrefix(*only, "fallback/") {
		lv.prog.Phase("fallback")
		res.Rows = append(res.Rows, fallbackRows(quiet)...)
		lv.prog.Phase("")
	}

	// The whole stack through nginx, the same route with the limiter and
	// without it.
	if *stackURL != "" {
		deciders := map[string]decider{}
		for _, route := range []string{"limiter-off", "limiter-on"} {
			deciders[route] = httpDecider(*stackURL + "/api/bench-" + strings.TrimPrefix(route, "limiter-"))
		}
		if *rlsAddr != "" {
			rls, err := loadtest.DialRLS(*rlsAddr)
			if err != nil {
				return err
			}
			defer rls.Close()
			deciders["auth-request"] = httpDecider(*stackURL + "/static/")
			deciders["grpc"] = rlsDecider(rls, loadtest.RLSPrefix+"bench/key")
		}
		for _, route := range []string{"limiter-off", "limiter-on", "auth-request", "grpc"} {
			d, ok := deciders[route]
			if !ok {
				continue
			}
			for _, g := range gs {
				if g >= 16 {
					add("stack/"+route, g, d)
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

// httpDecider GETs url (a route of the stack) and expects a 200; the key is
// not sent: the stack limits by client address, one key for the run, which
// its policy never refuses.
func httpDecider(url string) decider {
	client := loadtest.NewClient()
	return func(ctx context.Context, _ string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
		}
		return nil
	}
}

// rlsDecider calls the rate limit service on route with the key as the
// descriptor's value, and expects OK.
func rlsDecider(rls *loadtest.RLSClient, route string) decider {
	return func(ctx context.Context, key string) error {
		resp, _, err := rls.ShouldRateLimit(ctx, route, key)
		if err != nil {
			return err
		}
		if resp.GetOverallCode() != pb.RateLimitResponse_OK {
			return fmt.Errorf("%s: %s", route, resp.GetOverallCode())
		}
		return nil
	}
}

// job is one row measured in slices: its latencies and time so far.
type job struct {
	name    string
	g       int
	d       decider
	lat     []time.Duration
	elapsed time.Duration
	errs    sync.Map
	live    *live
}

// run runs j's decider from j.g goroutines for about d over random keys,
// after a warm-up (every key exists, the scripts are loaded) if warm.
func (j *job) run(ctx context.Context, d time.Duration, keys []string, warm bool) {
	if warm {
		for _, k := range keys[:min(len(keys), 1000)] {
			_ = j.d(ctx, k)
		}
	}
	lat := make([][]time.Duration, j.g)
	counts := j.live.begin(j.name, j.g)
	defer j.live.end(counts)
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range j.g {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), uint64(len(j.lat))))
			for time.Now().Before(deadline) {
				t := time.Now()
				if err := j.d(ctx, keys[r.IntN(len(keys))]); err != nil {
					j.errs.Store(err.Error(), true)
					counts[i].errs.Add(1)
				} else {
					counts[i].ok.Add(1)
				}
				lat[i] = append(lat[i], time.Since(t))
			}
		})
	}
	wg.Wait()
	j.elapsed += time.Since(start)
	for _, l := range lat {
		j.lat = append(j.lat, l...)
	}
}

// row sums up j's slices.
func (j *job) row() Row {
	slices.Sort(j.lat)
	j.errs.Range(func(k, _ any) bool {
		fmt.Fprintf(os.Stderr, "bench: %s at %d: error: %v\n", j.name, j.g, k)
		return false
	})
	row := Row{Name: j.name, Goroutines: j.g, DecisionsPerS: round(float64(len(j.lat)) / j.elapsed.Seconds()),
		P50us: pct(j.lat, 0.50), P99us: pct(j.lat, 0.99)}
	fmt.Fprintf(display, "%-28s %4d goroutines  %9.0f/s  p50 %7.1f µs  p99 %8.1f µs\n", j.name, j.g, row.DecisionsPerS, row.P50us, row.P99us)
	return row
}

func pct(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return round(float64(sorted[int(q*float64(len(sorted)-1))].Nanoseconds()) / 1000)
}

func round(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }

// sumCeiling sums up slices of one ceiling row, each of the same number of
// calls: their rate over the slices' total time (the harmonic mean of
// the slices' rates), and the median slice's p50 and p99 (redis-benchmark
// reports no latencies to merge).
func sumCeiling(sl []Row) Row {
	var secsPerCall float64
	p50s, p99s := make([]float64, len(sl)), make([]float64, len(sl))
	for i, r := range sl {
		secsPerCall += 1 / r.DecisionsPerS
		p50s[i], p99s[i] = r.P50us, r.P99us
	}
	slices.Sort(p50s)
	slices.Sort(p99s)
	row := sl[0]
	row.DecisionsPerS, row.P50us, row.P99us = round(float64(len(sl))/secsPerCall), p50s[len(sl)/2], p99s[len(sl)/2]
	fmt.Fprintf(display, "%-28s %4d connections %9.0f/s  p50 %7.1f µs  p99 %8.1f µs (%d slices)\n", row.Name, row.Goroutines, row.DecisionsPerS, row.P50us, row.P99us, len(sl))
	return row
}

// ceiling runs redis-benchmark against our GCRA script by EVALSHA.
func ceiling(ctx context.Context, client redis.UniversalClient, addr string, depth, keys, n int) (Row, error) {
	s := redisstore.Script(ratelimit.GCRA)
	if err := s.Load(ctx, client).Err(); err != nil {
		return Row{}, err
	}
	host, port, ok := strings.Cut(addr, ":")
	if !ok {
		return Row{}, fmt.Errorf("-redis %q: want host:port", addr)
	}
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return Row{}, errors.New("redis-benchmark not found (apt-get install redis-server)")
	}
	const conns = 64
	// ARGV as redisstore sends them (lua/decide.lua): now override (0:
	// Redis TIME), limit, window µs, capacity, cost, request id, weight.
	args := []string{"-h", host, "-p", port, "-c", strconv.Itoa(conns), "-P", strconv.Itoa(depth), "-n", strconv.Itoa(n),
		"-r", strconv.Itoa(keys), "--csv", "EVALSHA", s.Hash(), "1", "{rl:0000}:bench-ceiling:__rand_int__",
		"0", strconv.Itoa(limit), "1000000", strconv.Itoa(limit), "1", "", "1", "1"}
	outp, err := exec.CommandContext(ctx, bin, args...).Output()
	if err != nil {
		return Row{}, fmt.Errorf("redis-benchmark: %w", err)
	}
	recs, err := csv.NewReader(strings.NewReader(string(outp))).ReadAll()
	if err != nil || len(recs) < 2 {
		return Row{}, fmt.Errorf("redis-benchmark output %q: %v", outp, err)
	}
	col := func(name string) float64 {
		i := slices.Index(recs[0], name)
		if i < 0 || i >= len(recs[1]) {
			return 0
		}
		v, _ := strconv.ParseFloat(recs[1][i], 64)
		return v
	}
	row := Row{Name: "ceiling/redis-benchmark-P" + strconv.Itoa(depth), Goroutines: conns,
		DecisionsPerS: round(col("rps")), P50us: round(col("p50_latency_ms") * 1000), P99us: round(col("p99_latency_ms") * 1000)}
	fmt.Fprintf(display, "%-28s %4d connections %9.0f/s  p50 %7.1f µs  p99 %8.1f µs\n", row.Name, conns, row.DecisionsPerS, row.P50us, row.P99us)
	return row, nil
}

// fallbackRows measures the local decision of an instance whose Redis is
// out, and the journal's append of a grant (memory only and to a file).
func fallbackRows(logger *slog.Logger) []Row {
	var rows []Row
	bench := func(name string, fn func(b *testing.B)) {
		r := testing.Benchmark(fn)
		rows = append(rows, Row{Name: name, Goroutines: 1, NsPerOp: round(float64(r.NsPerOp())), AllocsPerOp: r.AllocsPerOp(),
			DecisionsPerS: round(float64(r.N) / r.T.Seconds())})
		fmt.Fprintf(display, "%-28s %10d ns/op %4d allocs/op\n", name, r.NsPerOp(), r.AllocsPerOp())
	}
	bench("fallback/decision", func(b *testing.B) {
		lim, err := resilient.New(downStore{}, resilient.Config{Instance: "bench-fallback", Logger: logger, ExpectedInstances: 4})
		if err != nil {
			b.Fatal(err)
		}
		defer lim.Close(context.Background())
		p := ratelimit.Policy{Name: "fb", Algorithm: ratelimit.GCRA, Limit: ratelimit.MaxLimit, Window: time.Second}
		for lim.Breaker() != resilient.Open {
			_, _ = lim.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "warm"})
			time.Sleep(time.Millisecond)
		}
		keys := make([]string, 1000)
		for i := range keys {
			keys[i] = "k" + strconv.Itoa(i)
			// Every key decided once before the clock starts, and the
			// decision checked: an invalid policy measured only its error.
			if d, err := lim.Decide(context.Background(), ratelimit.Request{Policy: p, Key: keys[i]}); err != nil || d.Mode != ratelimit.ModeLocal {
				b.Fatalf("fallback decision: %+v, %v", d, err)
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			_, _ = lim.Decide(context.Background(), ratelimit.Request{Policy: p, Key: keys[i%len(keys)]})
		}
	})
	// The fallback's memory with 1M distinct keys: bounded by its key
	// capacity (the service's default, 100 000), not by the keys seen.
	{
		lim, err := resilient.New(downStore{}, resilient.Config{Instance: "bench-memory", Logger: logger, ExpectedInstances: 4, JournalMax: 1})
		if err == nil {
			p := ratelimit.Policy{Name: "fb", Algorithm: ratelimit.GCRA, Limit: 100, Window: time.Second}
			for lim.Breaker() != resilient.Open {
				_, _ = lim.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "warm"})
				time.Sleep(time.Millisecond)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			const keys = 1_000_000
			start := time.Now()
			for i := range keys {
				_, _ = lim.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "m" + strconv.Itoa(i)})
			}
			elapsed := time.Since(start)
			runtime.GC()
			runtime.ReadMemStats(&after)
			st := lim.Status()
			_ = lim.Close(context.Background())
			heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			rows = append(rows, Row{Name: "fallback/memory-1M-keys", Goroutines: 1, DecisionsPerS: round(keys / elapsed.Seconds()),
				HeapBytes: heap, KeysHeld: int64(st.Keys)})
			fmt.Fprintf(display, "%-28s %10d keys held of 1M, heap +%d MiB\n", "fallback/memory-1M-keys", st.Keys, heap>>20)
		}
	}
	for _, dir := range []string{"", "file"} {
		name := "fallback/journal-append-memory"
		if dir != "" {
			name = "fallback/journal-append-file"
		}
		bench(name, func(b *testing.B) {
			d := ""
			if dir != "" {
				d = b.TempDir()
			}
			j, err := journal.Open(d, "bench", 1<<30, logger)
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			p := ratelimit.Policy{Name: "fb", Algorithm: ratelimit.GCRA, Limit: 100, Window: time.Second}
			id := ratelimit.IdentityOf("k")
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				_ = j.Append(p, id, ratelimit.Grant{At: int64(i), Cost: 1})
			}
		})
	}
	return rows
}

// downStore is a Store whose every call fails at once: the fallback decides.
type downStore struct{}

var errDown = fmt.Errorf("%w: bench: down", ratelimit.ErrUnavailable)

func (downStore) Decide(context.Context, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, errDown
}
func (downStore) Ping(context.Context) error { return errDown }
func (downStore) Heartbeat(context.Context, string, time.Duration, time.Duration) (ratelimit.Fleet, error) {
	return ratelimit.Fleet{}, errDown
}
func (downStore) Generation(context.Context) (string, error) { return "", errDown }
func (downStore) Leave(context.Context, string, time.Duration, time.Duration) error {
	return errDown
}
func (downStore) Replay(_ context.Context, b []ratelimit.ReplayBatch) ([]ratelimit.ReplayResult, []error) {
	errs := make([]error, len(b))
	for i := range errs {
		errs[i] = errDown
	}
	return make([]ratelimit.ReplayResult, len(b)), errs
}

func find(res Results, name string, g int) *Row {
	for i, r := range res.Rows {
		if r.Name == name && (g == 0 || r.Goroutines == g) {
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
	ours1, peer1 := find(*res, "ours/gcra", 1), find(*res, "peer/redis_rate", 1)
	if ours1 != nil && peer1 != nil && peer1.P50us > 0 {
		res.Ratios["ours_p50_vs_redis_rate_at_1"] = round(ours1.P50us/peer1.P50us*100) / 100
	}
	for _, g := range []int{16, 64, 256} {
		on, off := find(*res, "stack/limiter-on", g), find(*res, "stack/limiter-off", g)
		if on != nil && off != nil && off.DecisionsPerS > 0 {
			res.Ratios[fmt.Sprintf("stack_on_vs_off_at_%d", g)] = round(on.DecisionsPerS/off.DecisionsPerS*100) / 100
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
			if r.Name == "ours/gcra" {
				best = max(best, r.DecisionsPerS)
			}
		}
		res.Ratios["ours_gcra_best_vs_ceiling_P16"] = round(best/c.DecisionsPerS*100) / 100
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
	fmt.Fprintf(&b, "Each row is one limiter or command at one concurrency: `ours/*` is our limiter as the service deploys it (the resilient layer over redisstore, 50 ms timeout) with `RL_REDIS_PIPELINES=%d` (`-coalesce`), `peer/*` the peer libraries (every side on one go-redis client of %d connections), `ceiling/*` redis-benchmark running our own GCRA script by EVALSHA (64 connections, 1 and 16 commands per round trip), `fallback/*` the in-memory decision an instance makes while Redis is out and the journaling of its grant, `stack/*` the native stack (nginx, four instances, Redis; the apps dial Redis directly, log at info) answering one route with its limiter (a GCRA policy it never refuses) and without (a route with no policies), requests per second through nginx over keep-alive connections; beside them the doors for other languages through the same nginx and instances (docs/DOORS.md): `stack/auth-request` a static site (a second nginx) whose every request nginx first checks with an instance (auth_request, a GCRA policy it never refuses), `stack/grpc` Envoy's rate limit service (ShouldRateLimit over one plaintext HTTP/2 connection, a descriptor per key, GCRA). The load generator and Redis share the machine's cores.\n\n", res.Coalesce, res.Pool)
	var mem strings.Builder
	b.WriteString("| row | goroutines | decisions/s | p50 µs | p99 µs | ns/op | allocs/op |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range res.Rows {
		p50, p99, ns, allocs := fmt.Sprintf("%.1f", r.P50us), fmt.Sprintf("%.1f", r.P99us), "", ""
		if r.NsPerOp > 0 { // a Go benchmark: ns/op, not a latency distribution
			p50, p99, ns, allocs = "", "", fmt.Sprint(r.NsPerOp), fmt.Sprint(r.AllocsPerOp)
		}
		if r.HeapBytes != 0 {
			p50, p99 = "", ""
			fmt.Fprintf(&mem, "- `%s`: %d keys held locally (the key capacity) after 1 000 000 distinct keys were decided; the heap grew by %.0f MiB.\n", r.Name, r.KeysHeld, float64(r.HeapBytes)/(1<<20))
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %s | %s |\n", r.Name, r.Goroutines, r.DecisionsPerS, p50, p99, ns, allocs)
	}
	if mem.Len() > 0 {
		b.WriteString("\nThe fallback's memory:\n\n" + mem.String())
	}
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
