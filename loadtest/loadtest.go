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
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"net/url"
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

// SourcePerKey as Config.Sources sends each key from a loopback address of
// its own against a loopback IPv4 target (the default of the loadtest
// command): the service's per-address ceiling then applies to each key
// alone, as it would to clients spread over the Internet.
const SourcePerKey = -1

// maxSources is the most source addresses, 127.0.0.2 to 127.0.0.251.
const maxSources = 250

// loopback4 says whether the base URL's host is an IPv4 loopback address
// or localhost (which the client dials as 127.0.0.1).
func loopback4(base string) bool {
	u, err := url.Parse(base)
	if err != nil {
		return false
	}
	if strings.EqualFold(u.Hostname(), "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(u.Hostname())
	return err == nil && ip.Unmap().Is4() && ip.Unmap().IsLoopback()
}

// Config is one load run. The zero value is not usable: BaseURL and
// Duration are required, and Policies must cover every route unless the
// run may learn them (LearnPolicies).
type Config struct {
	// BaseURL is the service, e.g. http://127.0.0.1:8080. Its host must be
	// a loopback address (or "localhost").
	BaseURL string
	// Routes to load at once (DefaultRoutes).
	Routes []string
	// Mix of keys per route (DefaultMix).
	Mix []KeySpec
	// RouteMix gives a route a mix of its own, instead of Mix.
	RouteMix map[string][]KeySpec
	// Policies by route. A route missing here is learned from its
	// RateLimit-Policy header before the load starts.
	Policies map[string]Policy
	// RunID makes the key names unique to the run (a random one).
	RunID string
	// Seed fixes the send schedule (send offsets and jitter): the same seed
	// gives the same schedule relative to the start.
	Seed uint64
	// Jitter spreads each send uniformly over ±Jitter/2 of the interval
	// around its slot, 0 <= Jitter < 1 (0.8). Slots are k * interval plus a
	// random per-key offset, so the jitter never accumulates: a key sends
	// at most ceil(rate * window) + 1 requests in any window.
	Jitter float64
	// Duration bounds the run; required.
	Duration time.Duration
	// MaxRequests bounds the number of requests sent (10 000 000).
	MaxRequests int64
	// MaxInFlight bounds the requests waiting for an answer (1024); a send
	// due while the bound is reached waits.
	MaxInFlight int
	// RLS calls the routes of Envoy's rate limit service (RLSPrefix);
	// required when there are any.
	RLS *RLSClient
	// APIKeySecret signs the keys as the service checks them
	// (RL_API_KEY_SECRET; DemoAPIKeySecret in the demo stacks). Empty: the
	// key names are sent as they are, which a service with checked keys
	// refuses with 401.
	APIKeySecret string
	// Client sends the requests (NewClient()).
	Client *http.Client
	// Sources spreads the keys over this many loopback source addresses,
	// 127.0.0.2 and up (key i sends from address i mod Sources), each with
	// a client of its own (NewClientFrom): the service sees that many
	// client addresses, and a per-address ceiling applies to each. 0: every
	// key sends through Client. SourcePerKey: one per key (at most 250)
	// when the base URL is an IPv4 loopback address or localhost, else 0.
	// At most 250; the base URL must then be an IPv4 loopback address or
	// localhost.
	Sources int
	// AbortShare is the share of the HTTP requests (0 to 0.5) whose client
	// resets its connection once it has sent the request: half at once,
	// half at a random point up to AbortWithin (a typical answer's time): a
	// client that gives up.
	// Such a request's record is Aborted, unless its answer came first.
	AbortShare float64
	// AbortWithin bounds how long after sending an aborting client resets
	// its connection (10 ms).
	AbortWithin time.Duration
	// OnRecord, if set, receives every record, from one goroutine at a
	// time, in the order the answers arrive.
	OnRecord func(Record)
	// OnPhase, if set, is called as the run moves on: "learn" (reading the
	// policies of the routes that Policies lacks from their headers),
	// "load" (sending), "drain" (waiting for the answers in flight).
	OnPhase func(name string)
	// Now is the clock (time.Now).
	Now func() time.Time
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

func (c *Config) setDefaults() error {
	if c.BaseURL == "" {
		return errors.New("loadtest: no base URL")
	}
	if err := CheckLoopback(c.BaseURL); err != nil {
		return err
	}
	if c.Duration <= 0 {
		return errors.New("loadtest: the duration must be positive")
	}
	if len(c.Routes) == 0 {
		c.Routes = DefaultRoutes
	}
	if len(c.Mix) == 0 {
		c.Mix = DefaultMix
	}
	if c.RunID == "" {
		c.RunID = NewRunID()
	}
	if c.Jitter == 0 {
		c.Jitter = 0.8
	}
	if c.Jitter < 0 || c.Jitter >= 1 {
		return fmt.Errorf("loadtest: jitter %v: must be in [0, 1)", c.Jitter)
	}
	if c.MaxRequests <= 0 {
		c.MaxRequests = 10_000_000
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 1024
	}
	if c.Client == nil {
		c.Client = NewClient()
	}
	if c.Sources < SourcePerKey || c.Sources > maxSources {
		return fmt.Errorf("loadtest: sources %d: want 0 to %d, or %d (one per key)", c.Sources, maxSources, SourcePerKey)
	}
	if c.Sources == SourcePerKey && !loopback4(c.BaseURL) {
		c.Sources = 0
	}
	if c.Sources > 0 {
		if u, err := url.Parse(c.BaseURL); err == nil {
			if ip, err := netip.ParseAddr(u.Hostname()); err == nil && !ip.Unmap().Is4() {
				return fmt.Errorf("loadtest: sources: the base URL %s is not IPv4; the sources are 127.0.0.x", c.BaseURL)
			}
		}
	}
	for _, r := range c.Routes {
		if IsRLSRoute(r) {
			if c.RLS == nil {
				return errNoRLS
			}
			if _, _, err := rlsRoute(r); err != nil {
				return err
			}
		}
	}
	if c.AbortShare < 0 || c.AbortShare > 0.5 {
		return fmt.Errorf("loadtest: abort share %v: want 0 to 0.5", c.AbortShare)
	}
	if c.AbortWithin <= 0 {
		c.AbortWithin = 10 * time.Millisecond
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
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

	res := Result{RunID: cfg.RunID, Policies: policies, Keys: keys, ByStatus: map[int]int64{}}
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

func (c *Config) phase(name string) {
	if c.OnPhase != nil {
		c.OnPhase(name)
	}
}

// seedOf derives a key's second PCG seed from its position, so the
// schedule depends on Seed and the key's place in the mix, not on the run
// id (which only names the keys).
func seedOf(i int) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(strconv.Itoa(i)))
	return h.Sum64()
}
