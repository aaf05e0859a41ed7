package invariant

import (
	"cmp"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
)

// Input is everything the invariants are computed from.
type Input struct {
	Requests []Request
	Phases   []Phase
	// Policies by route; routes without one are not judged.
	Policies map[string]Policy
	// RedisTimeout is the apps' per-call Redis timeout (the latency bound
	// in fault and recovery is this plus 25 ms).
	RedisTimeout time.Duration
	// Affected lists the instances the fault cuts off from Redis (every
	// instance, or the partitioned one); failover_ms and recovery_ms are
	// measured on each of them and the worst is reported.
	Affected []string
	// FailedAtMS is when Redis failed (Unix ms: the first redis_down
	// event), where that is later than the fault phase's start; 0: its
	// start. failover_ms is measured from it.
	FailedAtMS float64
	// Statuses are the instances' /status documents after settle, plus
	// the last snapshot of any incarnation killed during the run.
	Statuses []InstanceStatus
	// NoFault: the scenario injects no fault (failover_ms and recovery_ms
	// are not judged).
	NoFault bool
	// Events are the run's events: the resets (EventReset) split their
	// keys' requests into what came before and after (over_admission,
	// goodput), and with their probes (EventResetProbe) give reset_held.
	Events []Event
	// Changes are the routes whose policy changed during the run
	// (Policies holds the one in force at the end).
	Changes map[string]Change
	// LeaseRoutes are the routes of lease policies: their over_admission
	// bound is LeaseOverAdmissionBound in every phase (a lease never
	// admits more than the policy would), and any answer other than 200
	// or 429 counts in errors.
	LeaseRoutes []string
}

// judgedRequests are the requests the client-side invariants judge: all
// but those whose client aborted them on purpose (their answer, and
// whether the fleet counted them, are unknown).
func judgedRequests(reqs []Request) []Request {
	out := reqs[:0:0]
	for _, r := range reqs {
		if !r.Aborted {
			out = append(out, r)
		}
	}
	return out
}

// Bounds of the contract.
var (
	overAdmissionBound = map[string]float64{Healthy: 1.00, Settle: 1.00, Fault: 1.05, Recovery: 1.05}
	politeLimitedBound = map[string]float64{Healthy: 0, Settle: 0, Fault: 0.01, Recovery: 0.01}
	goodputBound       = map[string]float64{Healthy: 0.90, Fault: 0.70, Recovery: 0.70, Settle: 0.90}
)

// LeaseOverAdmissionBound is the over_admission bound of a lease route in
// every phase: the lease promise.
const LeaseOverAdmissionBound = 1.00

// answerFailed reports whether r counts in errors: a 5xx or a transport
// error; on a lease route (strict) any answer other than 200 or 429.
func answerFailed(r Request, strict bool) bool {
	if strict && !r.Aborted {
		return r.Status != 200 && r.Status != 429
	}
	return r.Failed()
}

// Bounds of failover_ms and recovery_ms.
const (
	FailoverBoundMS = 1000
	RecoveryBoundMS = 3000
	// LatencySlackMS is the latency bound of healthy and settle, and what
	// fault and recovery allow beyond the Redis timeout.
	LatencySlackMS = 25
)

// Check computes every invariant row, in a stable order: per invariant, per
// route (sorted), per judged phase; then the fleet-wide rows.
func Check(in Input) []Row {
	all := in.Requests // aborted ones too: the ideal limiter of goodput is fed them
	in.Requests = judgedRequests(in.Requests)
	routes := make([]string, 0, len(in.Policies))
	for r := range in.Policies {
		routes = append(routes, r)
	}
	sort.Strings(routes)
	ps := spans(in.Phases)
	byRoute := map[string][]Request{}
	for _, r := range in.Requests {
		byRoute[r.Route] = append(byRoute[r.Route], r)
	}
	judged := make([]int, 0, len(JudgedPhases)) // indexes into in.Phases
	for i, p := range in.Phases {
		if slices.Contains(JudgedPhases, p.Name) {
			judged = append(judged, i)
		}
	}

	resets := resetsByKey(in.Events)
	change := func(route string) *Change {
		if c, ok := in.Changes[route]; ok {
			return &c
		}
		return nil
	}

	var rows []Row
	// over_admission
	for _, route := range routes {
		lease := slices.Contains(in.LeaseRoutes, route)
		vals, err := routeOverAdmission(in.Policies[route], change(route), resets, byRoute[route], in.Phases)
		for _, pi := range judged {
			name := in.Phases[pi].Name
			bound := overAdmissionBound[name]
			if lease {
				bound = LeaseOverAdmissionBound
			}
			row := Row{Name: OverAdmission, Route: route, Phase: name, Bound: bound}
			switch {
			case err != nil:
				row.Measured = err.Error()
			case !hasRequests(byRoute[route], ps, pi):
				row.Measured = "no requests"
			case math.IsNaN(vals[pi]):
				row.Measured, row.Pass = 0.0, true // nothing admitted
			default:
				row.Measured, row.Pass = round(vals[pi], 4), vals[pi] <= bound+eps
			}
			rows = append(rows, row)
		}
	}
	// polite_limited
	for _, route := range routes {
		for _, pi := range judged {
			name := in.Phases[pi].Name
			bound := politeLimitedBound[name]
			row := Row{Name: PoliteLimited, Route: route, Phase: name, Bound: bound}
			var polite, limited int
			for _, r := range byRoute[route] {
				if r.Class == "polite" && phaseOf(ps, recvUS(r)) == pi {
					polite++
					if r.Limited() {
						limited++
					}
				}
			}
			if polite == 0 {
				row.Measured = "no polite requests"
			} else {
				share := float64(limited) / float64(polite)
				row.Measured, row.Pass = round(share, 6), share <= bound+eps
			}
			rows = append(rows, row)
		}
	}
	// goodput
	allByRoute := map[string][]Request{}
	for _, r := range all {
		allByRoute[r.Route] = append(allByRoute[r.Route], r)
	}
	for _, route := range routes {
		vals, err := routeGoodput(in.Policies[route], change(route), resets, allByRoute[route], in.Phases)
		for _, pi := range judged {
			name := in.Phases[pi].Name
			bound, ok := goodputBound[name]
			if !ok {
				continue // the contract bounds goodput in every judged phase but warmup
			}
			row := Row{Name: Goodput, Route: route, Phase: name, Bound: bound}
			switch {
			case err != nil:
				row.Measured = err.Error()
			case math.IsNaN(vals[pi]):
				row.Measured = "no abusive request the ideal limiter admits"
			default:
				row.Measured, row.Pass = round(vals[pi], 4), vals[pi] >= bound-eps
			}
			rows = append(rows, row)
		}
	}
	// errors
	for _, route := range routes {
		strict := slices.Contains(in.LeaseRoutes, route)
		for _, pi := range judged {
			n := 0
			for _, r := range byRoute[route] {
				if answerFailed(r, strict) && phaseOf(ps, recvUS(r)) == pi {
					n++
				}
			}
			rows = append(rows, Row{Name: Errors, Route: route, Phase: in.Phases[pi].Name, Measured: n, Bound: 0, Pass: n == 0})
		}
	}
	// latency_p99_ms
	timeoutMS := float64(in.RedisTimeout) / float64(time.Millisecond)
	for _, route := range routes {
		for _, pi := range judged {
			name := in.Phases[pi].Name
			bound := float64(LatencySlackMS)
			if name == Fault || name == Recovery {
				bound = timeoutMS + LatencySlackMS
			}
			row := Row{Name: LatencyP99, Route: route, Phase: name, Bound: bound}
			var lat []float64
			for _, r := range byRoute[route] {
				if phaseOf(ps, recvUS(r)) == pi {
					lat = append(lat, r.LatencyMS)
				}
			}
			if len(lat) == 0 {
				row.Measured = "no requests"
			} else {
				p := P99(lat)
				row.Measured, row.Pass = round(p, 3), p <= bound+eps
			}
			rows = append(rows, row)
		}
	}
	// reset_held
	rows = append(rows, ResetHeldRows(all, in.Phases, in.Policies, in.Events)...)
	// rls_config_reloaded
	rows = append(rows, RLSConfigRow(all, in.Policies, in.Events, in.Statuses)...)
	// reconciled and uncounted
	rows = append(rows, ReconciledRow(in.Statuses))
	rows = append(rows, UncountedRows(in.Phases, in.Statuses)...)
	// failover_ms and recovery_ms
	if !in.NoFault {
		rows = append(rows, FailoverRows(in.Requests, in.Phases, in.Affected, in.FailedAtMS)...)
	}
	return rows
}

func hasRequests(reqs []Request, ps []phaseSpan, pi int) bool {
	for _, r := range reqs {
		if phaseOf(ps, recvUS(r)) == pi {
			return true
		}
	}
	return false
}

// RouteOverAdmission is the largest KeyOverAdmission over the route's keys,
// per phase (NaN: nothing admitted in that phase).
func RouteOverAdmission(p Policy, reqs []Request, phases []Phase) ([]float64, error) {
	return routeOverAdmission(p, nil, nil, reqs, phases)
}

// routeOverAdmission is RouteOverAdmission with the route's policy change
// (nil: none) and its keys' resets: a reset key's requests before and after
// each reset are judged as keys of their own (segments).
func routeOverAdmission(p Policy, c *Change, resets map[string][]resetSpan, reqs []Request, phases []Phase) ([]float64, error) {
	out := make([]float64, len(phases))
	for i := range out {
		out[i] = math.NaN()
	}
	for _, keyReqs := range byKey(reqs) {
		for _, seg := range segments(keyReqs, resets[keyReqs[0].Key]) {
			vals, err := keyOverAdmission(p, c, seg, phases)
			if err != nil {
				return nil, err
			}
			for i, v := range vals {
				if !math.IsNaN(v) && (math.IsNaN(out[i]) || v > out[i]) {
					out[i] = v
				}
			}
		}
	}
	return out, nil
}

// byKey groups requests by key, keys in sorted order.
func byKey(reqs []Request) [][]Request {
	m := map[string][]Request{}
	for _, r := range reqs {
		m[r.Key] = append(m[r.Key], r)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]Request, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}

// KeyGoodput feeds one key's requests, in t_send order, to an ideal single
// limiter of the policy at their t_send, and returns, per phase (by each
// request's t_recv), the requests the fleet admitted divided by those the
// ideal limiter admitted; NaN where the ideal limiter admitted none. A
// request its client aborted is fed to the ideal limiter (the fleet may
// have counted it) but judged neither way.
func KeyGoodput(p Policy, reqs []Request, phases []Phase) ([]float64, error) {
	return keyGoodput(p, nil, nil, reqs, phases)
}

// idealStep is a change of the ideal limiter at a time (µs): a switch to
// a policy (ideal.Switch), or a reset (a fresh limiter of the policy in
// force).
type idealStep struct {
	at     int64
	policy *Policy // nil: a reset
}

// keyGoodput is KeyGoodput with the route's policy change c (nil: none)
// and the key's resets. The ideal limiter learns both: a reset gives it a
// fresh limiter from the reset's t_recv on; a change switches it
// (ideal.Switch) from the old policy to the new one at the first reload's
// t_send when the new one is the stricter (a smaller limit, or the same
// limit and a smaller capacity), else at the last reload's t_recv: while
// the instances disagree, the fleet is not expected to admit more than the
// stricter of the two.
func keyGoodput(p Policy, c *Change, resets []resetSpan, reqs []Request, phases []Phase) ([]float64, error) {
	start := p
	var steps []idealStep
	if c != nil {
		start = c.Before
		at := msToUS(c.LastMS)
		if p.Limit < start.Limit || p.Limit == start.Limit && p.capacity() < start.capacity() {
			at = msToUS(c.FirstMS)
		}
		steps = append(steps, idealStep{at: at, policy: &p})
	}
	for _, r := range resets {
		steps = append(steps, idealStep{at: r.recv})
	}
	slices.SortStableFunc(steps, func(a, b idealStep) int { return cmp.Compare(a.at, b.at) })
	cur := start
	lim, err := ideal.New(cur.ideal())
	if err != nil {
		return nil, err
	}
	sorted := slices.Clone(reqs)
	slices.SortStableFunc(sorted, func(a, b Request) int {
		if c := cmp.Compare(sendUS(a), sendUS(b)); c != 0 {
			return c
		}
		return cmp.Compare(recvUS(a), recvUS(b))
	})
	ps := spans(phases)
	actual := make([]int, len(ps))
	want := make([]int, len(ps))
	for _, r := range sorted {
		for len(steps) > 0 && sendUS(r) > steps[0].at {
			st := steps[0]
			steps = steps[1:]
			if st.policy == nil {
				lim, err = ideal.New(cur.ideal())
			} else {
				cur = *st.policy
				lim, err = ideal.Switch(lim, st.at, cur.ideal())
			}
			if err != nil {
				return nil, err
			}
		}
		allowed := lim.Allow(sendUS(r))
		k := phaseOf(ps, recvUS(r))
		if k < 0 || r.Aborted {
			// An aborted request may have been counted by the fleet, so
			// the ideal limiter counts it too, and it is judged neither
			// way.
			continue
		}
		if allowed {
			want[k]++
		}
		if r.Admitted() {
			actual[k]++
		}
	}
	out := make([]float64, len(ps))
	for i := range out {
		if want[i] == 0 {
			out[i] = math.NaN()
		} else {
			out[i] = float64(actual[i]) / float64(want[i])
		}
	}
	return out, nil
}

// RouteGoodput is the smallest KeyGoodput over the route's abusive keys,
// per phase.
func RouteGoodput(p Policy, reqs []Request, phases []Phase) ([]float64, error) {
	return routeGoodput(p, nil, nil, reqs, phases)
}

// routeGoodput is RouteGoodput with the route's policy change and its keys'
// resets (keyGoodput).
func routeGoodput(p Policy, c *Change, resets map[string][]resetSpan, reqs []Request, phases []Phase) ([]float64, error) {
	out := make([]float64, len(phases))
	for i := range out {
		out[i] = math.NaN()
	}
	for _, keyReqs := range byKey(reqs) {
		if keyReqs[0].Class != "abusive" {
			continue
		}
		vals, err := keyGoodput(p, c, resets[keyReqs[0].Key], keyReqs, phases)
		if err != nil {
			return nil, err
		}
		for i, v := range vals {
			if !math.IsNaN(v) && (math.IsNaN(out[i]) || v < out[i]) {
				out[i] = v
			}
		}
	}
	return out, nil
}

// P99 is the nearest-rank 99th percentile of v (not modified).
func P99(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	rank := int(math.Ceil(0.99 * float64(len(s))))
	return s[max(rank-1, 0)]
}
