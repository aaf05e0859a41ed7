package main

// The measuring loop: the deciders of the rows, and the job that runs one
// row in slices and sums it up.

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/loadtest"
)

// decider is one decision against some limiter.
type decider func(ctx context.Context, key string) error

// httpDecider GETs url (a route of the stack) and expects a 200, as the
// client the key names: its X-API-Key is signed[key]. With signed nil no
// key is sent, and the stack limits every request by the client address:
// one hot key for the run. Either way the route's policy never refuses. It
// counts in elsewhere the responses whose X-RateLimit-Mode says their
// decision was not made in Redis.
func httpDecider(url string, signed map[string]string, elsewhere *atomic.Int64) decider {
	client := loadtest.NewClient()
	return func(ctx context.Context, key string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if signed != nil {
			req.Header.Set(loadtest.HeaderAPIKey, signed[key])
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if m := resp.Header.Get("X-RateLimit-Mode"); m != "" && m != string(ratelimit.ModeRedis) {
			elsewhere.Add(1)
		}
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

// job is one row measured in slices: its latencies and time so far, the
// CPU its Redis and this process spent over its slices (unless a reading
// failed), and how many of its decisions were not made in Redis.
type job struct {
	name     string
	g        int
	d        decider
	src      source
	lat      []time.Duration
	elapsed  time.Duration
	cpuUS    float64
	cpuLost  bool // a reading of Redis' CPU failed
	procUS   float64
	procLost bool // a reading of this process' CPU failed
	notRedis int64
	// The stack's apps' CPU and its Redis' read events over the slices
	// (stackcpu.go), unless a reading failed.
	appUS    float64
	appLost  bool
	reads    int64
	readLost bool
	errs     sync.Map
	errCount atomic.Int64
	live     *live
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
	cpu0, ok0 := j.src.redisCPU(ctx)
	proc0, pok0 := processCPU()
	app0, aok0 := procCPU(j.src.apps)
	var reads0 int64
	rok0 := false
	if j.src.redis != nil && j.src.cluster == nil {
		reads0, rok0 = redisReads(ctx, j.src.redis)
	}
	var else0 int64
	if j.src.elsewhere != nil {
		else0 = j.src.elsewhere()
	}
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
					j.errCount.Add(1)
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
	proc1, pok1 := processCPU()
	cpu1, ok1 := j.src.redisCPU(ctx)
	app1, aok1 := procCPU(j.src.apps)
	j.appLost = j.appLost || !aok0 || !aok1
	j.appUS += app1 - app0
	var reads1 int64
	rok1 := false
	if rok0 {
		reads1, rok1 = redisReads(ctx, j.src.redis)
	}
	j.readLost = j.readLost || !rok0 || !rok1
	j.reads += reads1 - reads0
	j.procLost = j.procLost || !pok0 || !pok1
	j.procUS += proc1 - proc0
	j.cpuLost = j.cpuLost || !ok0 || !ok1
	j.cpuUS += cpu1 - cpu0
	if j.src.elsewhere != nil {
		j.notRedis += j.src.elsewhere() - else0
	}
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
		P50us: pct(j.lat, 0.50), P99us: pct(j.lat, 0.99), NotInRedis: j.notRedis + j.errCount.Load()}
	if !j.cpuLost && len(j.lat) > 0 {
		row.RedisCPUus = round(j.cpuUS / float64(len(j.lat)))
	}
	if j.src.inProcess && !j.procLost && len(j.lat) > 0 {
		row.BenchCPUus = round(j.procUS / float64(len(j.lat)))
	}
	if len(j.src.apps) > 0 && !j.appLost && len(j.lat) > 0 {
		row.AppCPUus = round(j.appUS / float64(len(j.lat)))
	}
	if len(j.src.apps) > 0 && !j.readLost && j.reads > 0 {
		row.PerRedisRead = round(float64(len(j.lat)) / float64(j.reads))
	}
	fmt.Fprintf(display, "%-28s %4d goroutines  %9.0f/s  p50 %7.1f µs  p99 %8.1f µs%s\n", j.name, j.g, row.DecisionsPerS, row.P50us, row.P99us, row.suffix())
	return row
}

func pct(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return round(float64(sorted[int(q*float64(len(sorted)-1))].Nanoseconds()) / 1000)
}

func round(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }
