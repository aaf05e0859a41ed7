// What a load run is given (Config) and its checks and defaults.

package loadtest

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

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

func (c *Config) phase(name string) {
	if c.OnPhase != nil {
		c.OnPhase(name)
	}
}
