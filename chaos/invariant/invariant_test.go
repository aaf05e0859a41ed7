package invariant

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
	"github.com/fleetlimit/fleetlimit/loadtest"
)

// base is a Unix time in ms aligned to 10 s windows: the hand-made logs
// below give times relative to it.
const base = 1_700_000_000_000.0

// testPhases: warmup [0, 10 s), healthy [10, 20), fault [20, 35), recovery
// [35, 55), settle [55, 65), relative to base.
var testPhases = []Phase{
	{Name: Warmup, StartMS: base, EndMS: base + 10_000},
	{Name: Healthy, StartMS: base + 10_000, EndMS: base + 20_000},
	{Name: Fault, StartMS: base + 20_000, EndMS: base + 35_000},
	{Name: Recovery, StartMS: base + 35_000, EndMS: base + 55_000},
	{Name: Settle, StartMS: base + 55_000, EndMS: base + 65_000},
}

const (
	iWarmup = iota
	iHealthy
	iFault
	iRecovery
	iSettle
)

func pol(alg string, limit int64) Policy {
	return Policy{Name: alg, Algorithm: alg, Limit: limit, Window: 10 * time.Second}
}

// rq is a request of key k, sent and received at the given ms after base.
func rq(k string, send, recv float64, status int) Request {
	class := loadtest.Abusive
	if strings.HasPrefix(k, "polite") {
		class = loadtest.Polite
	}
	return Request{Key: k, Class: class, Route: "/r", TSendMS: base + send, TRecvMS: base + recv, Status: status, LatencyMS: recv - send}
}

func over(t *testing.T, p Policy, reqs []Request) []float64 {
	t.Helper()
	v, err := KeyOverAdmission(p, reqs, testPhases)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// 110 admissions within 5.5 s on a quota of 100: exactly 10% over.
func TestOverAdmissionWindowLogTenPercent(t *testing.T) {
	var reqs []Request
	for i := range 110 {
		s := 10_000 + float64(i)*50
		reqs = append(reqs, rq("k", s, s+2, 200))
	}
	reqs = append(reqs, rq("k", 16_000, 16_001, 429)) // refusals do not count
	v := over(t, pol(ideal.SlidingWindowLog, 100), reqs)
	if !near(v[iHealthy], 1.10) {
		t.Errorf("healthy: %v, want 1.10", v[iHealthy])
	}
	if !math.IsNaN(v[iFault]) {
		t.Errorf("fault: %v, want nothing (no admission)", v[iFault])
	}
}

// 100 admissions, then a 101st whose bracket makes the set span a whole
// window: not certain, so not counted.
func TestOverAdmissionWindowLogUncertain(t *testing.T) {
	var reqs []Request
	for i := range 100 {
		s := 10_000 + float64(i)*10
		reqs = append(reqs, rq("k", s, s+1, 200))
	}
	// Sent 9.5 s after the first, answered 10.002 s after it: with the first
	// request the set spans more than a window.
	reqs = append(reqs, rq("k", 19_500, 20_002, 200))
	v := over(t, pol(ideal.SlidingWindowLog, 100), reqs)
	if !near(v[iHealthy], 1.00) {
		t.Errorf("healthy: %v, want 1.00", v[iHealthy])
	}
	// Attributed to fault (its last request was received there): the 100
	// minus the first, plus the late one.
	if !near(v[iFault], 1.00) {
		t.Errorf("fault: %v, want 1.00", v[iFault])
	}
	// One more admission right after the first makes 101 certain.
	reqs = append(reqs, rq("k", 10_001, 10_003, 200))
	v = over(t, pol(ideal.SlidingWindowLog, 100), reqs)
	if !near(v[iHealthy], 1.01) {
		t.Errorf("healthy with one more: %v, want 1.01", v[iHealthy])
	}
}

// A set whose last request is received in the next phase belongs to that
// phase; its subsets ending earlier belong to the earlier one.
func TestOverAdmissionPhaseAttribution(t *testing.T) {
	var reqs []Request
	for i := range 104 {
		s := 15_000 + float64(i)*40
		reqs = append(reqs, rq("k", s, s+1, 200))
	}
	reqs = append(reqs, rq("k", 19_990, 20_001, 200)) // received in fault
	v := over(t, pol(ideal.SlidingWindowLog, 100), reqs)
	if !near(v[iHealthy], 1.04) || !near(v[iFault], 1.05) {
		t.Errorf("healthy %v, fault %v; want 1.04 and 1.05", v[iHealthy], v[iFault])
	}
}

// Sliding window counter: counted within aligned windows only; a bracket
// that straddles a window boundary is in neither.
func TestOverAdmissionWindowCounterAligned(t *testing.T) {
	var reqs []Request
	for i := range 100 { // window [10 s, 20 s)
		s := 15_000 + float64(i)*40
		reqs = append(reqs, rq("k", s, s+1, 200))
	}
	for i := range 5 { // straddlers: sent before 20 s, answered after
		reqs = append(reqs, rq("k", 19_998, 20_001+float64(i), 200))
	}
	for i := range 100 { // window [20 s, 30 s)
		s := 20_010 + float64(i)*40
		reqs = append(reqs, rq("k", s, s+1, 200))
	}
	p := pol(ideal.SlidingWindowCounter, 100)
	v := over(t, p, reqs)
	if !near(v[iHealthy], 1.00) || !near(v[iFault], 1.00) {
		t.Errorf("healthy %v, fault %v; want 1.00 and 1.00 (straddlers not counted)", v[iHealthy], v[iFault])
	}
	// The same 205 admissions judged as a sliding window log: 205 within
	// 10 s is certain there (sends 15.0 s to 23.97 s).
	if v := over(t, pol(ideal.SlidingWindowLog, 100), reqs); !near(v[iFault], 2.05) {
		t.Errorf("as a window log: fault %v, want 2.05", v[iFault])
	}
	// Ten more inside the second window: 110 in it, exactly 10% over.
	for i := range 10 {
		s := 25_000 + float64(i)
		reqs = append(reqs, rq("k", s, s+1, 200))
	}
	if v := over(t, p, reqs); !near(v[iFault], 1.10) {
		t.Errorf("fault %v, want 1.10", v[iFault])
	}
}

func TestOverAdmissionBucket(t *testing.T) {
	for _, alg := range []string{ideal.TokenBucket, ideal.GCRA} {
		t.Run(alg, func(t *testing.T) {
			p := pol(alg, 100) // capacity 100, refilled at 10/s
			// 110 at one instant, answered at once: 10% over.
			var burst []Request
			for range 110 {
				burst = append(burst, rq("k", 12_000, 12_000, 200))
			}
			if v := over(t, p, burst); !near(v[iHealthy], 1.10) {
				t.Errorf("burst: %v, want 1.10", v[iHealthy])
			}
			// A full burst, then exactly the refill rate (one per 100 ms)
			// with 1 ms latency: never over.
			var steady []Request
			for range 100 {
				steady = append(steady, rq("k", 10_000, 10_001, 200))
			}
			for m := 1; m <= 50; m++ {
				s := 10_000 + float64(m)*100
				steady = append(steady, rq("k", s, s+1, 200))
			}
			v := over(t, p, steady)
			// Best run: everything, n = 150, span 5001 ms, refill 50.01.
			if !near(v[iHealthy], 1+(150-100-50.01)/100) {
				t.Errorf("steady: %v, want 0.9999", v[iHealthy])
			}
			// One extra admission in the middle: 1% over, less the slack.
			steady = append(steady, rq("k", 12_000, 12_001, 200))
			if v := over(t, p, steady); !near(v[iHealthy], 1+(151-100-50.01)/100) {
				t.Errorf("one extra: %v, want 1.0099", v[iHealthy])
			}
		})
	}
}

func TestGoodput(t *testing.T) {
	// Sliding window log of 10 per 10 s; 20 sends, one every 500 ms, from
	// 10 s: the ideal limiter admits the first 10.
	p := pol(ideal.SlidingWindowLog, 10)
	mk := func(admitted int) []Request {
		var reqs []Request
		for i := range 20 {
			s := 10_000 + float64(i)*500
			st := 429
			if i < admitted {
				st = 200
			}
			reqs = append(reqs, rq("abusive-1", s, s+1, st))
		}
		return reqs
	}
	for _, tt := range []struct {
		admitted int
		want     float64
	}{{10, 1}, {9, 0.9}, {7, 0.7}, {12, 1.2}} {
		v, err := KeyGoodput(p, mk(tt.admitted), testPhases)
		if err != nil {
			t.Fatal(err)
		}
		if !near(v[iHealthy], tt.want) {
			t.Errorf("%d admitted: goodput %v, want %v", tt.admitted, v[iHealthy], tt.want)
		}
	}
	// The route's goodput is the worst abusive key's; polite keys do not
	// count.
	reqs := append(mk(10), mk(8)...)
	for i := range reqs[20:] {
		reqs[20+i].Key = "abusive-2"
	}
	polite := rq("polite-1", 10_000, 10_001, 429)
	v, err := RouteGoodput(p, append(reqs, polite), testPhases)
	if err != nil {
		t.Fatal(err)
	}
	if !near(v[iHealthy], 0.8) {
		t.Errorf("route goodput %v, want 0.8", v[iHealthy])
	}
}

func TestP99(t *testing.T) {
	var v []float64
	for i := 100; i >= 1; i-- {
		v = append(v, float64(i))
	}
	if got := P99(v); got != 99 {
		t.Errorf("p99 of 1..100 = %v, want 99", got)
	}
	if got := P99([]float64{5}); got != 5 {
		t.Errorf("p99 of one = %v", got)
	}
	if got := P99(append(make([]float64, 199), 1000)); got != 0 {
		t.Errorf("p99 of 199 zeros and one outlier = %v, want 0", got)
	}
}

func instReq(inst, mode string, recv float64) Request {
	r := rq("abusive-1", recv-1, recv, 200)
	r.Instance, r.Mode = inst, mode
	return r
}

func TestFailoverRows(t *testing.T) {
	reqs := []Request{
		instReq("app1", "redis", 20_300),
		instReq("app1", "local", 20_450),
		instReq("app2", "local", 20_900),
		instReq("app2", "local", 19_000), // before the fault: ignored
		instReq("app1", "redis", 35_500),
		instReq("app2", "local", 36_000),
		instReq("app2", "redis", 37_000),
		instReq("app2", "redis", 34_000), // during the fault: not recovery
	}
	rows := FailoverRows(reqs, testPhases, []string{"app1", "app2"}, 0)
	if rows[0].Name != FailoverMS || rows[0].Measured != 900.0 || !rows[0].Pass || rows[0].Phase != Fault {
		t.Errorf("failover row %+v, want 900 ms, pass", rows[0])
	}
	if rows[1].Name != RecoveryMS || rows[1].Measured != 2000.0 || !rows[1].Pass || rows[1].Phase != Recovery {
		t.Errorf("recovery row %+v, want 2000 ms, pass", rows[1])
	}
	rows = FailoverRows(reqs, testPhases, []string{"app1", "app3"}, 0)
	if m, ok := rows[0].Measured.(string); !ok || !strings.Contains(m, "app3") || rows[0].Pass {
		t.Errorf("failover with a silent instance: %+v", rows[0])
	}
	slow := append(reqs, instReq("app4", "local", 21_500), instReq("app4", "redis", 38_500))
	rows = FailoverRows(slow, testPhases, []string{"app1", "app4"}, 0)
	if rows[0].Measured != 1500.0 || rows[0].Pass || rows[1].Measured != 3500.0 || rows[1].Pass {
		t.Errorf("slow instance: %+v %+v; want 1500 and 3500, failing", rows[0], rows[1])
	}
	// Redis failed 400 ms into the fault (failover-lag cuts replication
	// first): failover is measured from then; a time outside the fault
	// phase is ignored.
	rows = FailoverRows(slow, testPhases, []string{"app1", "app2"}, base+20_400)
	if rows[0].Measured != 500.0 || !rows[0].Pass {
		t.Errorf("failed 400 ms into the fault: %+v, want 500 ms, pass", rows[0])
	}
	rows = FailoverRows(slow, testPhases, []string{"app1", "app4"}, base+5_000)
	if rows[0].Measured != 1500.0 {
		t.Errorf("a failure time before the fault: %+v, want it ignored (1500 ms)", rows[0])
	}
}

func status(inst string, final bool, doc string) InstanceStatus {
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		panic(err)
	}
	return InstanceStatus{Instance: inst, Final: final, Body: m}
}

// st is a /status document shaped like the app's: the limiter object with
// local_grants and the journal counters.
func st(inst string, final bool, granted, reloaded, replayed, present, dropped, dups, pending int) InstanceStatus {
	return status(inst, final, fmt.Sprintf(`{"instance":%q,"journal_size":%d,"limiter":{"local_grants":%d,
		"journal":{"granted":%d,"reloaded":%d,"replayed":%d,"present":%d,"dropped":%d,"duplicate_units":%d,"pending":%d}}}`,
		inst, pending, granted, granted, reloaded, replayed, present, dropped, dups, pending))
}

func TestReconciledRow(t *testing.T) {
	// A /status without the journal counters.
	row := ReconciledRow([]InstanceStatus{status("app1", true, `{"instance":"app1","journal_size":0}`)})
	if m, ok := row.Measured.(string); !ok || m != "status fields missing: local_grants, journal (in app1)" || row.Pass {
		t.Errorf("missing fields: %+v", row)
	}
	balanced := []InstanceStatus{
		st("app1", true, 10, 0, 6, 1, 3, 0, 0),
		st("app2", true, 5, 0, 4, 0, 1, 0, 0),
		// app3 was killed holding 2 grants; its successor inherited them.
		st("app3", false, 6, 0, 4, 0, 0, 0, 2),
		st("app3", true, 1, 2, 3, 0, 0, 0, 0),
	}
	row = ReconciledRow(balanced)
	want := Reconciliation{GrantedLocally: 22, Inherited: 2, HandedOver: 2, Replayed: 18, Present: 1, DroppedExpired: 4}
	if got, ok := row.Measured.(Reconciliation); !ok || got != want || !row.Pass {
		t.Errorf("balanced: %+v, want %+v passing", row, want)
	}
	for name, s := range map[string]InstanceStatus{
		"a grant never reconciled": st("app1", true, 11, 0, 7, 0, 3, 0, 0),
		"still journaled":          st("app1", true, 10, 0, 6, 0, 3, 0, 1),
		"duplicates unaccounted":   st("app1", true, 10, 0, 5, 0, 3, 1, 0),
	} {
		if row := ReconciledRow([]InstanceStatus{s}); row.Pass {
			t.Errorf("%s: passed: %+v", name, row)
		}
	}
	// A resend refused by its marker (the first send's acknowledgement was
	// lost) counts once.
	row = ReconciledRow([]InstanceStatus{st("app1", true, 10, 0, 5, 0, 3, 2, 0)})
	if got, ok := row.Measured.(Reconciliation); !ok || got.DuplicatesRefused != 2 || got.Imbalance != 0 || !row.Pass {
		t.Errorf("refused duplicates: %+v", row)
	}
	// Without journal.pending, journal_size says what is still journaled.
	row = ReconciledRow([]InstanceStatus{status("app1", true, `{"journal_size":1,"local_grants":3,"journal":{"reloaded":0,"replayed":2,"present":0,"dropped":0,"duplicate_units":0}}`)})
	if got, ok := row.Measured.(Reconciliation); !ok || got.Journaled != 1 || got.Imbalance != 0 || row.Pass {
		t.Errorf("journal_size: %+v", row)
	}
	row = ReconciledRow([]InstanceStatus{{Instance: "app1", Err: "connection refused"}})
	if m, ok := row.Measured.(string); !ok || !strings.Contains(m, "connection refused") || row.Pass {
		t.Errorf("unavailable: %+v", row)
	}
	if row := ReconciledRow(nil); row.Pass {
		t.Errorf("no statuses: %+v", row)
	}
}

// TestCheck runs every invariant over a small log of one route and checks
// the rows' shape, order and a few values.
func TestCheck(t *testing.T) {
	var reqs []Request
	add := func(r Request, inst, mode string) {
		r.Route, r.Instance, r.Mode = "/api/sliding-window-log", inst, mode
		reqs = append(reqs, r)
	}
	for ph := 0; ph < 65; ph++ { // one polite and one abusive request a second
		s := float64(ph) * 1000
		mode := "redis"
		if s >= 20_000 && s < 35_000 {
			mode = "local"
		}
		add(rq("polite-1", s+100, s+101, 200), "app1", mode)
		add(rq("abusive-1", s+200, s+202, 200), "app1", mode)
	}
	add(rq("polite-1", 19_990, 20_010, 429), "app1", "local") // received in fault
	add(rq("abusive-1", 40_000, 40_003, 502), "", "")
	add(rq("abusive-1", 56_000, 58_000, 0), "", "")
	aborted := rq("abusive-1", 30_000, 30_004, 0)
	aborted.Aborted = true // not an error, not judged
	add(aborted, "", "")
	phases := slices.Clone(testPhases)
	for i, counted := range []float64{0, 0, 0, 2, 2} { // 2 uncounted in fault
		phases[i].Uncounted = map[string]float64{"app1": counted}
	}
	in := Input{
		Requests:     reqs,
		Phases:       phases,
		Policies:     map[string]Policy{"/api/sliding-window-log": pol(ideal.SlidingWindowLog, 100)},
		RedisTimeout: 100 * time.Millisecond,
		Affected:     []string{"app1"},
		Statuses:     []InstanceStatus{status("app1", true, `{"journal_size":0,"uncounted_requests":2}`)},
	}
	rows := Check(in)
	if len(rows) != 4+4+4+4+4+1+4+2 {
		t.Fatalf("%d rows", len(rows))
	}
	get := func(name, phase string) Row {
		for _, r := range rows {
			if r.Name == name && r.Phase == phase {
				return r
			}
		}
		t.Fatalf("no row %s/%s", name, phase)
		return Row{}
	}
	if r := get(PoliteLimited, Fault); !near(r.Measured.(float64), round(1.0/16, 6)) || r.Pass {
		t.Errorf("polite_limited in fault: %+v", r) // 1 of 16 polite requests
	}
	if r := get(PoliteLimited, Healthy); r.Measured != 0.0 || !r.Pass {
		t.Errorf("polite_limited in healthy: %+v", r)
	}
	if r := get(Errors, Recovery); r.Measured != 1 || r.Pass {
		t.Errorf("errors in recovery: %+v", r)
	}
	if r := get(Errors, Settle); r.Measured != 1 || r.Pass {
		t.Errorf("errors in settle: %+v", r)
	}
	if r := get(Errors, Healthy); r.Measured != 0 || !r.Pass {
		t.Errorf("errors in healthy: %+v", r)
	}
	if r := get(LatencyP99, Settle); r.Bound != 25.0 || r.Pass {
		t.Errorf("latency in settle (a 2 s transport error): %+v", r)
	}
	if r := get(LatencyP99, Fault); r.Bound != 125.0 || !r.Pass {
		t.Errorf("latency in fault: %+v", r)
	}
	if r := get(OverAdmission, Healthy); !r.Pass || r.Measured.(float64) > 0.2 {
		t.Errorf("over_admission in healthy: %+v", r)
	}
	if r := get(Goodput, Healthy); r.Measured != 1.0 || !r.Pass {
		t.Errorf("goodput in healthy: %+v", r)
	}
	if r := get(FailoverMS, Fault); r.Measured != 10.0 || !r.Pass {
		t.Errorf("failover: %+v", r) // first local answer: the 429 at 20.010 s
	}
	if r := get(Reconciled, Settle); r.Pass {
		t.Errorf("reconciled without the fields: %+v", r)
	}
	if r := get(Uncounted, Fault); r.Measured != 2.0 || r.Pass {
		t.Errorf("uncounted in fault: %+v", r)
	}
	if r := get(Uncounted, Settle); r.Measured != 0.0 || !r.Pass {
		t.Errorf("uncounted in settle: %+v", r)
	}
	if r := get(Errors, Fault); r.Measured != 0 || !r.Pass {
		t.Errorf("errors in fault (an aborted request is none): %+v", r)
	}
	for _, r := range rows {
		if r.Phase == Warmup {
			t.Errorf("warmup judged: %+v", r)
		}
	}
}

// TestGoodputFeedsAbortedRequests: a request its client aborted may have
// been counted by the fleet: the ideal limiter counts it too (it takes the
// one place of the window here), and it is judged neither way, so the
// fleet's refusal of the next request is no loss of goodput.
func TestGoodputFeedsAbortedRequests(t *testing.T) {
	aborted := rq("abusive-1", 12_000, 12_003, 0)
	aborted.Aborted = true
	reqs := []Request{aborted, rq("abusive-1", 13_000, 13_002, 429), rq("abusive-1", 14_000, 14_002, 429)}
	vals, err := KeyGoodput(pol(ideal.SlidingWindowLog, 1), reqs, testPhases)
	if err != nil {
		t.Fatal(err)
	}
	if v := vals[iHealthy]; !math.IsNaN(v) {
		t.Fatalf("healthy goodput %v, want none judged (the ideal admits only the aborted request)", v)
	}
}
