// Package invariant computes the chaos suite's invariants
// (README.md, "The chaos suite", which lists the bounds check.go holds) from a request log, the
// phases of the run, the routes' policies and the instances' /status after
// settle.
//
// A request admitted by the fleet was decided at some instant between its
// t_send and its t_recv. Every measure counts only what is certain under
// that bracket, and is attributed to the phase in which its last request was
// received (a single request: its own t_recv). Times are handled as integer
// Unix microseconds.
package invariant

import (
	"math"
	"time"

	"github.com/fleetlimit/fleetlimit/loadtest"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
)

// Phase names, in their order.
const (
	Warmup   = "warmup"
	Healthy  = "healthy"
	Fault    = "fault"
	Recovery = "recovery"
	Settle   = "settle"
)

// PhaseNames lists the phases in order.
var PhaseNames = []string{Warmup, Healthy, Fault, Recovery, Settle}

// JudgedPhases are the phases the invariants judge (warmup is not judged).
var JudgedPhases = []string{Healthy, Fault, Recovery, Settle}

// Invariant names.
const (
	OverAdmission = "over_admission"
	PoliteLimited = "polite_limited"
	Goodput       = "goodput"
	Errors        = "errors"
	LatencyP99    = "latency_p99_ms"
	Reconciled    = "reconciled"
	Uncounted     = "uncounted"
	FailoverMS    = "failover_ms"
	RecoveryMS    = "recovery_ms"
	ResetHeld     = "reset_held"
	RLSConfig     = "rls_config_reloaded"
)

// AllRoutes is the route of rows about the whole fleet.
const AllRoutes = "*"

// Request is one line of requests.jsonl: the load generator's record of a
// request, read as it wrote it.
type Request = loadtest.Record

// sendUS and recvUS are a request's send and receive times in µs.
func sendUS(r Request) int64 { return msToUS(r.TSendMS) }
func recvUS(r Request) int64 { return msToUS(r.TRecvMS) }

// Event is one line of events.jsonl. The events of an operator's action
// that the invariants judge (EventReset, EventResetProbe, EventReload) also
// say what it acted on and when the call that made it was sent and
// answered: it took effect somewhere between TSendMS and TRecvMS.
type Event struct {
	TMS    float64 `json:"t_ms"`
	Event  string  `json:"event"`
	Detail string  `json:"detail,omitempty"`
	// Key is the load's key (its API key id) a reset or probe is about;
	// Route its route; Policy the policy named in the reset ("": every
	// policy).
	Key    string `json:"key,omitempty"`
	Route  string `json:"route,omitempty"`
	Policy string `json:"policy,omitempty"`
	// Instance took the action (the reset, the reload) or answered the
	// probe.
	Instance string `json:"instance,omitempty"`
	// TSendMS and TRecvMS bracket the action (Unix ms).
	TSendMS float64 `json:"t_send_ms,omitempty"`
	TRecvMS float64 `json:"t_recv_ms,omitempty"`
	// Version is the configuration version Instance reported
	// (EventRLSConfig, EventRLSReload).
	Version string `json:"version,omitempty"`
}

// Events the invariants read.
const (
	// EventReset: an operator's POST /admin/reset of Key under Policy,
	// through Instance.
	EventReset = "reset"
	// EventResetProbe: the requests of Key sent between TSendMS and
	// TRecvMS, one after the other through Instance, that read how much
	// of its quota the store holds (reset_held).
	EventResetProbe = "reset_probe"
	// EventReload: Instance re-read its policy file, changed by the
	// scenario (the new policy version in Detail).
	EventReload = "reload"
	// EventRLSReload: Instance re-read its rate limit service
	// configuration, changed by the scenario without a signal (the app
	// noticed the directory change), and reported Version; Route is the
	// door route whose requests that configuration decides.
	EventRLSReload = "rls_reload"
	// EventRLSConfig: Instance's rate limit service configuration version
	// before the load (Version).
	EventRLSConfig = "rls_config"
)

// Phase is one phase of a run: [StartMS, EndMS) in Unix milliseconds.
type Phase struct {
	Name    string  `json:"name"`
	StartMS float64 `json:"start_ms"`
	EndMS   float64 `json:"end_ms"`
	// CPUBusyPct and CPUStealPct are the machine's CPU use during the
	// phase, in percent of all its cores' time: busy, and taken by the
	// hypervisor (steal). Absent where unknown (not Linux).
	CPUBusyPct  *float64 `json:"cpu_busy_pct,omitempty"`
	CPUStealPct *float64 `json:"cpu_steal_pct,omitempty"`
	// Uncounted is each instance's count of requests whose handler ran
	// without a counted decision (its /status uncounted_requests), read
	// as the phase began; an instance that did not answer is absent.
	Uncounted map[string]float64 `json:"uncounted,omitempty"`
	// Leases are each instance's lease counters (its /status lease), read
	// as the phase began: what lease mode did in the phase before
	// (informational).
	Leases map[string]LeaseCounters `json:"leases,omitempty"`
}

// LeaseCounters are an instance's lease mode counters (/status lease).
type LeaseCounters struct {
	Draws      float64 `json:"draws"`
	Served     float64 `json:"served"`
	Refunded   float64 `json:"refunded_units"`
	Unrefunded float64 `json:"unrefunded_units"`
	Held       float64 `json:"held"`
}

// Policy is a route's policy as the suite knows it: learned from the
// RateLimit-Policy header (name, quota, window) and the algorithm named by
// the route. For token bucket and GCRA the quota is the capacity, refilled
// at Limit per Window.
type Policy struct {
	Name      string
	Algorithm string
	Limit     int64
	Window    time.Duration
	Capacity  int64
}

func (p Policy) capacity() int64 {
	if p.Capacity > 0 {
		return p.Capacity
	}
	return p.Limit
}

func (p Policy) ideal() ideal.Policy {
	return ideal.Policy{Algorithm: p.Algorithm, Limit: p.Limit, WindowUS: p.Window.Microseconds(), Capacity: p.capacity()}
}

// Row is one judged invariant: Measured is a number, or a string saying why
// there is none (which fails the row).
type Row struct {
	Name     string `json:"name"`
	Route    string `json:"route"`
	Phase    string `json:"phase"`
	Measured any    `json:"measured"`
	Bound    any    `json:"bound"`
	Pass     bool   `json:"pass"`
}

// msToUS converts Unix milliseconds (with a fraction) to microseconds.
func msToUS(ms float64) int64 { return int64(math.Round(ms * 1000)) }

// phaseSpan is a phase in µs.
type phaseSpan struct {
	name       string
	start, end int64
}

func spans(phases []Phase) []phaseSpan {
	out := make([]phaseSpan, len(phases))
	for i, p := range phases {
		out[i] = phaseSpan{name: p.Name, start: msToUS(p.StartMS), end: msToUS(p.EndMS)}
	}
	return out
}

// phaseOf returns the index of the phase holding t, or -1.
func phaseOf(ps []phaseSpan, t int64) int {
	for i, p := range ps {
		if t >= p.start && t < p.end {
			return i
		}
	}
	return -1
}

// round rounds v to d decimals.
func round(v float64, d int) float64 {
	f := math.Pow(10, float64(d))
	return math.Round(v*f) / f
}

const eps = 1e-9
