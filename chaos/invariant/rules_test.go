package invariant

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
)

// A reset splits a key: its requests before and after are judged against
// a quota each; one that overlaps the reset is in neither.
func TestSegments(t *testing.T) {
	reqs := []Request{
		rq("k", 1_000, 1_010, 200), // before
		rq("k", 4_990, 5_001, 200), // overlaps the reset [5000, 5020]
		rq("k", 5_010, 5_015, 200), // sent during it
		rq("k", 5_021, 5_030, 200), // after
	}
	segs := segments(reqs, []resetSpan{{send: msToUS(base + 5_000), recv: msToUS(base + 5_020)}})
	if len(segs) != 2 || len(segs[0]) != 1 || len(segs[1]) != 1 || segs[0][0].TSendMS != base+1_000 || segs[1][0].TSendMS != base+5_021 {
		t.Errorf("segments %+v", segs)
	}
	if segs := segments(reqs, nil); len(segs) != 1 || len(segs[0]) != 4 {
		t.Errorf("without a reset: %+v", segs)
	}
}

// Over a reset the fleet may admit a fresh quota: 100 before it and 100
// after it within one window is no over-admission; 101 after it is.
func TestOverAdmissionAcrossAReset(t *testing.T) {
	p := pol(ideal.SlidingWindowLog, 100)
	var reqs []Request
	for i := range 100 {
		s := 10_000 + float64(i)*20
		reqs = append(reqs, rq("k", s, s+1, 200))
	}
	for i := range 100 {
		s := 13_000 + float64(i)*20
		reqs = append(reqs, rq("k", s, s+1, 200))
	}
	events := []Event{{Event: EventReset, Key: "k", TSendMS: base + 12_500, TRecvMS: base + 12_510}}
	vals, err := routeOverAdmission(p, nil, resetsByKey(events), reqs, testPhases)
	if err != nil || !near(vals[iHealthy], 1.00) {
		t.Errorf("with the reset: %v, %v; want 1.00", vals[iHealthy], err)
	}
	if vals, _ := routeOverAdmission(p, nil, nil, reqs, testPhases); !near(vals[iHealthy], 2.00) {
		t.Errorf("without it: %v, want 2.00", vals[iHealthy])
	}
	reqs = append(reqs, rq("k", 16_000, 16_001, 200))
	if vals, _ := routeOverAdmission(p, nil, resetsByKey(events), reqs, testPhases); !near(vals[iHealthy], 1.01) {
		t.Errorf("one more after it: %v, want 1.01", vals[iHealthy])
	}
}

// The allowance against its definition, over every subset of small random
// logs: each certain set (one window, or one aligned window) over its own
// quota, by its first send and last receive.
func TestOverAdmissionWithAChangeAgainstBruteForce(t *testing.T) {
	const w = int64(10_000_000)
	rng := rand.New(rand.NewPCG(3, 5))
	ps := spans(testPhases)
	for trial := range 300 {
		reqs := randomLog(rng, 1+rng.IntN(9))
		first := float64(8_000 + rng.IntN(15_000))
		c := &Change{Before: pol(ideal.SlidingWindowLog, 2), FirstMS: base + first, LastMS: base + first + float64(rng.IntN(6_000))}
		for _, tc := range []struct {
			alg   string
			valid func(lo, hi int64) bool
		}{
			{ideal.SlidingWindowLog, func(lo, hi int64) bool { return hi-lo < w }},
			{ideal.SlidingWindowCounter, func(lo, hi int64) bool { return hi < (floorDiv(lo, w)+1)*w }},
		} {
			p := pol(tc.alg, 3)
			c.Before.Algorithm = tc.alg
			al, err := newAllowance(p, c)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]float64, len(ps))
			for i := range want {
				want[i] = math.NaN()
			}
			for mask := uint(1); mask < 1<<len(reqs); mask++ {
				var sub []Request
				for i := range reqs {
					if mask&(1<<i) != 0 {
						sub = append(sub, reqs[i])
					}
				}
				lo, hi := span(sub)
				if !tc.valid(lo, hi) {
					continue
				}
				if k := phaseOf(ps, hi); k >= 0 {
					v := float64(len(sub)) / al.of(lo, hi).limit
					if math.IsNaN(want[k]) || v > want[k] {
						want[k] = v
					}
				}
			}
			got, err := keyOverAdmission(p, c, reqs, testPhases)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.IsNaN(want[i]) != math.IsNaN(got[i]) || !math.IsNaN(want[i]) && !near(want[i], got[i]) {
					t.Fatalf("trial %d, %s, phase %s: got %v, brute force %v; change %+v; log %+v",
						trial, tc.alg, testPhases[i].Name, got[i], want[i], c, reqs)
				}
			}
		}
	}
}

// While the instances disagree, a token bucket may hold the old capacity
// plus the new one; before the first reload the old, a window after the
// last the new.
func TestOverAdmissionBucketWithAChange(t *testing.T) {
	before, after := pol(ideal.TokenBucket, 150), pol(ideal.TokenBucket, 100)
	c := &Change{Before: before, FirstMS: base + 20_000, LastMS: base + 30_000}
	burst := func(at float64, n int) []Request {
		var out []Request
		for range n {
			out = append(out, rq("k", at, at, 200))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		reqs []Request
		k    int
		want float64
	}{
		{"150 before the first reload", burst(12_000, 150), iHealthy, 1.00},
		{"151 before the first reload", burst(12_000, 151), iHealthy, 1 + 1.0/150},
		{"250 in the transition", burst(25_000, 250), iFault, 1.00},
		{"101 a window after the last reload", burst(41_000, 101), iRecovery, 1.01},
	} {
		got, err := keyOverAdmission(after, c, tc.reqs, testPhases)
		if err != nil || !near(got[tc.k], tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got[tc.k], err, tc.want)
		}
	}
	c.Before.Window = 5 * time.Second
	if _, err := keyOverAdmission(after, c, burst(1, 1), testPhases); err == nil {
		t.Error("a change of window was judged")
	}
}

// The ideal limiter of goodput learns a reset (a fresh quota from its
// answer on) and a change (the stricter policy from the first reload, the
// looser one from the last).
func TestGoodputLearnsResetsAndChanges(t *testing.T) {
	p := pol(ideal.SlidingWindowLog, 10)
	var reqs []Request
	for i := range 20 { // 10 s to 11.9 s, all admitted by the fleet
		s := 10_000 + float64(i)*100
		reqs = append(reqs, rq("k", s, s+1, 200))
	}
	if v, _ := keyGoodput(p, nil, nil, reqs, testPhases); !near(v[iHealthy], 2) {
		t.Errorf("without a reset: %v, want 2 (the ideal admits 10)", v[iHealthy])
	}
	reset := []resetSpan{{send: msToUS(base + 10_950), recv: msToUS(base + 10_990)}}
	if v, _ := keyGoodput(p, nil, reset, reqs, testPhases); !near(v[iHealthy], 1) {
		t.Errorf("with a reset after the tenth: %v, want 1", v[iHealthy])
	}
	// Raised from 10 to 20 between 10.5 s and 11.5 s: the ideal keeps 10
	// until the last reload (the first ten, none of the six to 11.5 s),
	// then admits the last four under 20.
	raise := &Change{Before: pol(ideal.SlidingWindowLog, 10), FirstMS: base + 10_500, LastMS: base + 11_500}
	if v, _ := keyGoodput(pol(ideal.SlidingWindowLog, 20), raise, nil, reqs, testPhases); !near(v[iHealthy], 20.0/14) {
		t.Errorf("raised: %v, want 20/14", v[iHealthy])
	}
	// Lowered from 20 to 10 from the first reload (10.5 s) on: the first
	// five under 20, then nothing until the window has 10 at most.
	lower := &Change{Before: pol(ideal.SlidingWindowLog, 20), FirstMS: base + 10_450, LastMS: base + 11_500}
	if v, _ := keyGoodput(p, lower, nil, reqs, testPhases); !near(v[iHealthy], 2) {
		t.Errorf("lowered: %v, want 2 (the ideal admits 10)", v[iHealthy])
	}
}

// resetLog is a reset key of a sliding window log of 100: before spent
// from 27 s, the reset at [29 s, 29.01 s], after spent from 30 s, then a
// probe through a healthy instance at 36 s (recovery) that admits probe of
// 110 and is refused the rest.
func resetLog(before, after, probe int) ([]Request, []Event) {
	var reqs []Request
	for i := range before {
		s := 27_000 + float64(i)*10
		r := rq("k", s, s+2, 200)
		r.Mode = "local"
		reqs = append(reqs, r)
	}
	for i := range after {
		s := 30_000 + float64(i)*10
		r := rq("k", s, s+2, 200)
		r.Mode = "local"
		reqs = append(reqs, r)
	}
	for i := range 110 {
		s := 36_000 + float64(i)*2
		status := 200
		if i >= probe {
			status = 429
		}
		r := rq("k", s, s+1, status)
		r.Mode = "redis"
		reqs = append(reqs, r)
	}
	events := []Event{
		{Event: EventReset, Key: "k", Route: "/r", Policy: "swl", TSendMS: base + 29_000, TRecvMS: base + 29_010},
		{Event: EventResetProbe, Key: "k", Route: "/r", TSendMS: base + 36_000, TRecvMS: base + 36_000 + 109*2 + 1},
	}
	return reqs, events
}

func TestResetHeld(t *testing.T) {
	policies := map[string]Policy{"/r": pol(ideal.SlidingWindowLog, 100)}
	for _, tc := range []struct {
		name                 string
		before, after, probe int
		want                 any
	}{
		{"held", 20, 5, 95, 0},
		{"pre-reset usage came back", 20, 5, 75, 20},
		{"post-reset usage lost", 20, 5, 100, -5},
	} {
		reqs, events := resetLog(tc.before, tc.after, tc.probe)
		checks := ResetChecks(reqs, testPhases, policies, events)
		if len(checks) != 1 || checks[0].Measured != tc.want || checks[0].Before != tc.before || checks[0].After != tc.after ||
			checks[0].Phase != Recovery {
			t.Errorf("%s: %+v, want %v", tc.name, checks, tc.want)
		}
		rows := ResetHeldRows(reqs, testPhases, policies, events)
		pass := tc.want == 0
		if len(rows) != 1 || rows[0].Pass != pass || rows[0].Measured != float64(tc.want.(int)) {
			t.Errorf("%s: rows %+v", tc.name, rows)
		}
	}
}

func TestResetHeldNotExact(t *testing.T) {
	policies := map[string]Policy{"/r": pol(ideal.SlidingWindowLog, 100)}
	for _, tc := range []struct {
		name  string
		edit  func([]Request, []Event) ([]Request, []Event)
		route Policy
	}{
		{"a request overlaps the reset", func(r []Request, e []Event) ([]Request, []Event) {
			return append(r, rq("k", 28_990, 29_005, 200)), e
		}, Policy{}},
		{"a probe answered locally", func(r []Request, e []Event) ([]Request, []Event) {
			r[len(r)-1].Mode = "local"
			return r, e
		}, Policy{}},
		{"the probe never refused", func(r []Request, e []Event) ([]Request, []Event) {
			for i := range r {
				if r[i].Status == 429 {
					r[i].Status = 200
				}
			}
			return r, e
		}, Policy{}},
		{"an admission aged out before the probe", func(r []Request, e []Event) ([]Request, []Event) {
			return append(r, rq("k", 26_000, 26_001, 200)), e
		}, Policy{}},
		{"no probe", func(r []Request, e []Event) ([]Request, []Event) { return r, e[:1] }, Policy{}},
		{"not a sliding window log", func(r []Request, e []Event) ([]Request, []Event) { return r, e }, pol(ideal.GCRA, 100)},
	} {
		reqs, events := resetLog(20, 5, 95)
		reqs, events = tc.edit(reqs, events)
		ps := policies
		if tc.route.Algorithm != "" {
			ps = map[string]Policy{"/r": tc.route}
		}
		rows := ResetHeldRows(reqs, testPhases, ps, events)
		if len(rows) != 1 || rows[0].Pass || !isText(rows[0].Measured) {
			t.Errorf("%s: rows %+v, want a failed row saying why", tc.name, rows)
		}
	}
}

// On a lease route any answer but 200 and 429 is an error, and the
// over-admission bound is 1.00 in fault and recovery too.
func TestLeaseRoute(t *testing.T) {
	p := pol(ideal.GCRA, 100)
	var reqs []Request
	for range 103 {
		reqs = append(reqs, rq("k", 25_000, 25_000, 200))
	}
	bad := rq("k", 26_000, 26_001, 400)
	reqs = append(reqs, bad)
	for i := range reqs {
		reqs[i].Route = "/lease"
	}
	in := Input{Requests: reqs, Phases: testPhases, Policies: map[string]Policy{"/lease": p}, NoFault: true}
	rowOf := func(rows []Row, name string) Row {
		i := slices.IndexFunc(rows, func(r Row) bool { return r.Name == name && r.Phase == Fault })
		return rows[i]
	}
	rows := Check(in)
	if r := rowOf(rows, OverAdmission); !r.Pass || r.Bound != 1.05 {
		t.Errorf("an ordinary route: %+v", r)
	}
	if r := rowOf(rows, Errors); !r.Pass {
		t.Errorf("an ordinary route counts a 400 as an error: %+v", r)
	}
	in.LeaseRoutes = []string{"/lease"}
	rows = Check(in)
	if r := rowOf(rows, OverAdmission); r.Pass || r.Bound != LeaseOverAdmissionBound {
		t.Errorf("the lease route: %+v, want a failure against 1.00", r)
	}
	if r := rowOf(rows, Errors); r.Pass || r.Measured != 1 {
		t.Errorf("the lease route's 400: %+v, want 1 error", r)
	}
}
