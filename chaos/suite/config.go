// What a run is given: its stack, phases, load and bounds (Config), and
// how the routes' policies are judged (AlgorithmOf, judgedPolicy).

package suite

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
	"github.com/fleetlimit/fleetlimit/chaos/invariant"
	"github.com/fleetlimit/fleetlimit/chaos/stack"
	"github.com/fleetlimit/fleetlimit/loadtest"
	"github.com/fleetlimit/fleetlimit/loadtest/progress"
)

// Durations of the phases. Zero fields take the contract's defaults: warmup
// and healthy one window, fault 15 s, recovery two windows, settle one
// window, and redis-flap's four cycles over 20 s.
type Durations struct {
	Warmup, Healthy, Fault, Recovery, Settle time.Duration
	Flap                                     time.Duration
	// Prime is how long the stack is primed before the measured run
	// (primeStack): 3 s by default, none when negative.
	Prime time.Duration
}

func (d Durations) withDefaults(window time.Duration) Durations {
	def := func(v *time.Duration, x time.Duration) {
		if *v <= 0 {
			*v = x
		}
	}
	def(&d.Warmup, window)
	def(&d.Healthy, window)
	def(&d.Fault, 15*time.Second)
	def(&d.Recovery, 2*window)
	def(&d.Settle, window)
	def(&d.Flap, 20*time.Second)
	if d.Prime == 0 {
		d.Prime = 3 * time.Second
	}
	return d
}

// Config is one run of the suite.
type Config struct {
	Stack     stack.Stack
	Scenarios []Scenario
	// Out is the output directory (chaos-out).
	Out string
	// Routes are loaded and judged (loadtest.DefaultRoutes and LeaseRoute).
	Routes []string
	// Mix is the load's keys per route, in the prime and in the measured
	// run (loadtest.DefaultMix, the contract's load). The suite's own tests
	// use a lighter one: their fake fleet runs in the test process, under
	// the race detector, beside other packages' tests.
	Mix []loadtest.KeySpec
	// DoorMix is the load's keys on each door route (DoorMix): the doors
	// are judged as the routes are, at a lighter load, so that the
	// machine's CPU goes to the service's own routes.
	DoorMix []loadtest.KeySpec
	// LeaseMix is the load's keys on LeaseRoute (LeaseMix).
	LeaseMix  []loadtest.KeySpec
	Durations Durations
	// RedisTimeout is the apps' Redis call timeout, unless their /status
	// reports one (redis_timeout_ms or redis_timeout).
	RedisTimeout time.Duration
	// Seed fixes the load's send schedule.
	Seed uint64
	// APIKeySecret signs the load's API keys as the stack checks them
	// (its RL_API_KEY_SECRET; loadtest.DemoAPIKeySecret by default).
	APIKeySecret string
	// Log receives progress lines.
	Log io.Writer
	// Progress, if set, follows each scenario's phases and answers (give
	// it as Log too, so that on a terminal the lines scroll above its
	// status block).
	Progress *progress.Reporter

	// rls calls the stack's rate limit service, and routeMix gives
	// LeaseRoute its mix (setDefaults) and the door routes theirs
	// (withDoors).
	rls      *loadtest.RLSClient
	routeMix map[string][]loadtest.KeySpec
}

// LeaseRoute is the route of the suite's lease policy (chaos/policies.json:
// GCRA, 300 per 10 s, leases of up to 2 s).
const LeaseRoute = "/api/lease-gcra"

// LeaseMix is the load on LeaseRoute: 2 polite keys at 40% of the quota,
// hot enough for leases (12 requests/s each, 6 a lease's lifetime at each
// of four instances), and 1 abusive key at 2x (84 requests/s in all).
var LeaseMix = []loadtest.KeySpec{
	{Class: loadtest.Polite, Factor: 0.4, Count: 2},
	{Class: loadtest.Abusive, Factor: 2, Count: 1},
}

func (c *Config) setDefaults() {
	if len(c.Routes) == 0 {
		c.Routes = append(slices.Clone(loadtest.DefaultRoutes), LeaseRoute)
	}
	if c.DoorMix == nil {
		c.DoorMix = DoorMix
	}
	if c.LeaseMix == nil {
		c.LeaseMix = LeaseMix
	}
	if slices.Contains(c.Routes, LeaseRoute) {
		c.routeMix = map[string][]loadtest.KeySpec{LeaseRoute: c.LeaseMix}
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.RedisTimeout <= 0 {
		c.RedisTimeout = 100 * time.Millisecond
	}
	if c.APIKeySecret == "" {
		c.APIKeySecret = loadtest.DemoAPIKeySecret
	}
}

// AlgorithmOf names the algorithm of a demo route, or of a policy named
// after its algorithm, or ending in "-<algorithm>" or ".<algorithm>"
// ("static-sliding-window-counter", "chaos.gcra"); "" if neither says.
func AlgorithmOf(route, policyName string) string {
	for _, s := range []string{strings.TrimPrefix(route, "/api/"), policyName} {
		s = strings.ReplaceAll(s, "-", "_")
		for _, alg := range []string{ideal.TokenBucket, ideal.GCRA, ideal.SlidingWindowLog, ideal.SlidingWindowCounter} {
			if s == alg || strings.HasSuffix(s, "_"+alg) || strings.HasSuffix(s, "."+alg) {
				return alg
			}
		}
	}
	return ""
}

// judgedPolicy is a learned policy as the invariants judge it: the
// algorithm from the route or the policy's name; for token bucket and
// GCRA the header's quota is the capacity, refilled over the window.
func judgedPolicy(route string, p loadtest.Policy) (invariant.Policy, error) {
	alg := AlgorithmOf(route, p.Name)
	if alg == "" {
		return invariant.Policy{}, fmt.Errorf("route %s: cannot tell its algorithm (policy %q)", route, p.Name)
	}
	ip := invariant.Policy{Name: p.Name, Algorithm: alg, Limit: p.Quota, Window: p.Window}
	if alg == ideal.TokenBucket || alg == ideal.GCRA {
		ip.Capacity = p.Quota
	}
	return ip, nil
}
