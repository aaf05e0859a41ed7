// Package loadtest drives the chaos suite's load against a rate-limited
// HTTP service (README.md, "Running the chaos suite"): for every route
// at once, polite keys at 40% of the quota and abusive keys at 2x and 10x,
// each key an independent sender with jittered send times, so that no key's
// requests line up with the round-robin of the balancer in front.
//
// It is black-box: it speaks HTTP, and gRPC to Envoy's rate limit service
// for the routes that name it (RLSPrefix); it learns each route's quota and
// window from the RateLimit-Policy header (or takes them as given), and
// records every request as one Record (a line of requests.jsonl). It only
// ever connects to loopback addresses.
package loadtest

// The load's plan (routes, keys, rates), the senders that carry it out and
// the Record they write; policies and the loopback guard are in their own
// files.

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Headers read and sent.
const (
	HeaderAPIKey    = "X-API-Key"
	HeaderRequestID = "X-Request-Id"
	HeaderServedBy  = "X-Served-By"
	HeaderMode      = "X-RateLimit-Mode"
)

// maxBody bounds how much of a response body is read (and discarded).
const maxBody = 64 << 10

// DefaultRoutes are the four algorithm routes of the demo stacks.
var DefaultRoutes = []string{
	"/api/token-bucket",
	"/api/sliding-window-log",
	"/api/sliding-window-counter",
	"/api/gcra",
}

// ShortRoute abbreviates a route for key names: "/api/token-bucket" is
// "tb", "/api/sliding-window-log" "swl", "/api/sliding-window-counter"
// "swc", "/api/gcra" "gcra"; a route of the rate limit service
// "rls:<domain>/<key>" is "rls-<key>"; any other route its last path
// element.
func ShortRoute(route string) string {
	if _, key, err := rlsRoute(route); err == nil {
		return "rls-" + key
	}
	switch route {
	case "/api/token-bucket":
		return "tb"
	case "/api/sliding-window-log":
		return "swl"
	case "/api/sliding-window-counter":
		return "swc"
	case "/api/gcra":
		return "gcra"
	}
	r := strings.TrimRight(route, "/")
	if i := strings.LastIndexByte(r, '/'); i >= 0 {
		r = r[i+1:]
	}
	if r == "" {
		return "root"
	}
	return r
}

// Class is a key's behaviour: polite keys stay well within their quota,
// abusive keys exceed it.
type Class string

// The classes.
const (
	Polite  Class = "polite"
	Abusive Class = "abusive"
)

// KeySpec is Count keys of one class, each sending Factor times its quota
// per window.
type KeySpec struct {
	Class  Class
	Factor float64
	Count  int
}

// DefaultMix is the contract's load per route: 4 polite keys at 40% of the
// quota, 4 abusive keys at 2x, 1 abusive key at 10x.
var DefaultMix = []KeySpec{
	{Class: Polite, Factor: 0.4, Count: 4},
	{Class: Abusive, Factor: 2, Count: 4},
	{Class: Abusive, Factor: 10, Count: 1},
}

// Record is one request: one line of requests.jsonl. Times are Unix
// milliseconds with microsecond precision; Status is 0 for a transport
// error (Error then says what happened).
type Record struct {
	TSendMS   float64 `json:"t_send_ms"`
	TRecvMS   float64 `json:"t_recv_ms"`
	Route     string  `json:"route"`
	Key       string  `json:"key"`
	Class     Class   `json:"class"`
	Status    int     `json:"status"`
	RequestID string  `json:"request_id"`
	Instance  string  `json:"instance"`
	Mode      string  `json:"mode"`
	LatencyMS float64 `json:"latency_ms"`
	Error     string  `json:"error,omitempty"`
	// RefusedBy names the policy that refused a 429 (RefusedBy); absent
	// on other answers.
	RefusedBy string `json:"refused_by,omitempty"`
	// Aborted: the client reset the connection on purpose before the answer
	// came (Config.AbortShare); Status is 0. Whether the fleet counted the
	// request is not known.
	Aborted bool `json:"aborted,omitempty"`
}

// Admitted reports whether the fleet admitted the request (a 2xx answer).
func (r Record) Admitted() bool { return r.Status >= 200 && r.Status < 300 }

// Limited reports whether the request was refused (429).
func (r Record) Limited() bool { return r.Status == 429 }

// Failed reports whether the request got no answer or a 5xx, other than a
// request its client aborted on purpose.
func (r Record) Failed() bool { return !r.Aborted && (r.Status == 0 || r.Status >= 500) }

// UnixMS converts t to Unix milliseconds, keeping microseconds.
func UnixMS(t time.Time) float64 { return float64(t.UnixMicro()) / 1000 }

// Key is one simulated client of one route.
type Key struct {
	Route string
	// Name is the key's identity: the id of its API key, and what the
	// records call it.
	Name string
	// Header is the X-API-Key value: Name signed with the run's
	// APIKeySecret (package apikey), or Name itself without a secret.
	Header string
	Class  Class
	Factor float64
	// Interval is the mean time between two sends.
	Interval time.Duration
}

// Result sums up a run.
type Result struct {
	RunID    string
	Policies map[string]Policy
	Keys     []Key
	Sent     int64
	// ByStatus counts the answers by HTTP status (0: transport error).
	ByStatus map[int]int64
	Start    time.Time
	End      time.Time
	// Sources is how many loopback source addresses the keys were sent
	// from (0: the client's own).
	Sources int
}

// NewRunID returns a short random run id (12 base-36 characters).
func NewRunID() string {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 12)
	for i := range b {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}

// Keys returns the keys of a run: for each route, for each KeySpec of its
// mix (routeMix's, else mix), Count keys named
// "<class>-<short route>-<n>-<runID>" (n counts from 1 within the route; in
// DefaultMix the 10x key is "abusive-tb-5-<runID>").
func Keys(routes []string, mix []KeySpec, routeMix map[string][]KeySpec, policies map[string]Policy, runID string) ([]Key, error) {
	var keys []Key
	for _, r := range routes {
		p, ok := policies[r]
		if !ok || p.Quota <= 0 || p.Window <= 0 {
			return nil, fmt.Errorf("loadtest: no policy for %s", r)
		}
		specs := mix
		if m, ok := routeMix[r]; ok {
			specs = m
		}
		counts := map[Class]int{}
		for _, s := range specs {
			if s.Factor <= 0 {
				return nil, fmt.Errorf("loadtest: factor %v: must be positive", s.Factor)
			}
			for range s.Count {
				counts[s.Class]++
				rate := s.Factor * p.Rate() // requests per second
				keys = append(keys, Key{
					Route:    r,
					Name:     fmt.Sprintf("%s-%s-%d-%s", s.Class, ShortRoute(r), counts[s.Class], runID),
					Class:    s.Class,
					Factor:   s.Factor,
					Interval: time.Duration(float64(time.Second) / rate),
				})
			}
		}
	}
	return keys, nil
}

// Run drives the load until cfg.Duration has passed, cfg.MaxRequests have
// been sent or ctx is done, then waits for the answers still in flight
// (each bounded by the client's timeout) and returns.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.setDefaults(); err != nil {
		return Result{}, err
	}
	policies := make(map[string]Policy, len(cfg.Routes))
	var missing []string
	for _, r := range cfg.Routes {
		if p, ok := cfg.Policies[r]; ok {
			policies[r] = p
		} else {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		cfg.phase("learn")
		learned, err := LearnRoutes(ctx, cfg.Client, cfg.RLS, cfg.BaseURL, missing, cfg.RunID, cfg.APIKeySecret)
		if err != nil {
			return Result{}, err
		}
		for r, p := range learned {
			policies[r] = p
		}
	}
	keys, err := Keys(cfg.Routes, cfg.Mix, cfg.RouteMix, policies, cfg.RunID)
	if err != nil {
		return Result{}, err
	}
	if cfg.Sources == SourcePerKey {
		cfg.Sources = min(len(keys), maxSources)
	}
	for i := range keys {
		if keys[i].Header, err = SignKey(cfg.APIKeySecret, keys[i].Name); err != nil {
			return Result{}, err
		}
	}

	res := Result{RunID: cfg.RunID, Policies: policies, Keys: keys, ByStatus: map[int]int64{}, Sources: cfg.Sources}
	records := make(chan Record, 4096)
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for r := range records {
			res.ByStatus[r.Status]++
			if cfg.OnRecord != nil {
				cfg.OnRecord(r)
			}
		}
	}()

	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	base := strings.TrimRight(cfg.BaseURL, "/")
	clientOf := func(int) *http.Client { return cfg.Client }
	if cfg.Sources > 0 {
		clients := make([]*http.Client, cfg.Sources)
		for j := range clients {
			clients[j] = NewClientFrom(netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + j)}))
			defer clients[j].CloseIdleConnections()
		}
		clientOf = func(i int) *http.Client { return clients[i%len(clients)] }
	}
	abortClient := cfg.Client
	if cfg.AbortShare > 0 {
		abortClient = newAbortingClient()
		defer abortClient.CloseIdleConnections()
	}
	var (
		sent     atomic.Int64
		inflight = make(chan struct{}, cfg.MaxInFlight)
		requests sync.WaitGroup
		senders  sync.WaitGroup
	)
	cfg.phase("load")
	res.Start = cfg.Now()
	deadline := res.Start.Add(cfg.Duration)
	for i, k := range keys {
		senders.Add(1)
		go func() {
			defer senders.Done()
			rng := rand.New(rand.NewPCG(cfg.Seed, seedOf(i)))
			aborts := rand.New(rand.NewPCG(cfg.Seed^0xab, seedOf(i)))
			for at := range schedule(rng, res.Start, deadline, k.Interval, cfg.Jitter) {
				if !sleepUntil(runCtx, cfg.Now, at) {
					return
				}
				select {
				case inflight <- struct{}{}:
				case <-runCtx.Done():
					return
				}
				if sent.Add(1) > cfg.MaxRequests {
					<-inflight
					cancel()
					return
				}
				abortAfter := time.Duration(-1)
				if cfg.AbortShare > 0 && aborts.Float64() < cfg.AbortShare {
					// Half at once (the request written, nothing read),
					// half at a random point up to AbortWithin.
					abortAfter = 0
					if aborts.IntN(2) == 0 {
						abortAfter = time.Duration(aborts.Int64N(int64(cfg.AbortWithin) + 1))
					}
				}
				requests.Add(1)
				go func() {
					defer requests.Done()
					defer func() { <-inflight }()
					// The request itself outlives the run's deadline: an
					// answer already on its way is recorded, within the
					// client's timeout.
					if IsRLSRoute(k.Route) {
						records <- cfg.RLS.send(context.WithoutCancel(ctx), k, cfg.Now)
						return
					}
					if abortAfter >= 0 && !IsRLSRoute(k.Route) {
						records <- sendAborting(context.WithoutCancel(ctx), abortClient, base, k, cfg.Now, abortAfter)
						return
					}
					records <- send(context.WithoutCancel(ctx), clientOf(i), base, k, cfg.Now)
				}()
			}
		}()
	}
	senders.Wait()
	cfg.phase("drain")
	requests.Wait()
	close(records)
	<-collected
	res.Sent = min(sent.Load(), cfg.MaxRequests)
	res.End = cfg.Now()
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
}

// seedOf derives a key's second PCG seed from its position, so the
// schedule depends on Seed and the key's place in the mix, not on the run
// id (which only names the keys).
func seedOf(i int) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(strconv.Itoa(i)))
	return h.Sum64()
}
