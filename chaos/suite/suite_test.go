package suite

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
	"github.com/fleetlimit/fleetlimit/chaos/invariant"
	"github.com/fleetlimit/fleetlimit/chaos/report"
	"github.com/fleetlimit/fleetlimit/chaos/stack"
	"github.com/fleetlimit/fleetlimit/loadtest"
	"github.com/fleetlimit/fleetlimit/loadtest/progress"
)

// fakeFleet imitates nginx in front of four instances sharing one exact
// limiter per key: the policy headers of the four demo routes (quota 10 per
// 1 s), X-Served-By round robin, and X-RateLimit-Mode "local" on the
// instances the fake stack has cut off from Redis.
type fakeFleet struct {
	mu       sync.Mutex
	limiters map[string]ideal.Limiter
	n        atomic.Int64
	cut      func(app string) bool
	// held reports whether app holds another instance's share back: it
	// then refuses every request, as an instance deciding against the
	// limit less the missing instance's share refuses some early.
	held func(app string) bool
	// window is every route's window in seconds (0: 1), its quota 10.
	window int
}

func (f *fakeFleet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := f.n.Add(1)
	app := fmt.Sprintf("app%d", n%4+1)
	path := r.URL.Path
	// An instance's own URL (stack.App.URL, AdminURL): /appN/...
	if rest, ok := strings.CutPrefix(path, "/app"); ok && len(rest) > 1 && rest[1] == '/' {
		app, path = "app"+rest[:1], rest[1:]
	}
	if path == "/admin/reset" {
		// As the apps do: the stack's admin token or 401.
		if r.Header.Get("Authorization") != "Bearer "+fakeAdminToken {
			http.Error(w, "no valid bearer token", http.StatusUnauthorized)
			return
		}
		f.reset(w, r, app)
		return
	}
	name := strings.TrimPrefix(path, "/api/")
	alg := AlgorithmOf(path, name)
	if alg == "" {
		http.NotFound(w, r)
		return
	}
	f.mu.Lock()
	k := path + "|" + strings.SplitN(r.Header.Get("X-API-Key"), ".", 2)[0]
	lim := f.limiters[k]
	if lim == nil {
		lim, _ = ideal.New(ideal.Policy{Algorithm: alg, Limit: 10, WindowUS: int64(max(1, f.window)) * 1_000_000})
		f.limiters[k] = lim
	}
	ok := !f.held(app) && lim.Allow(time.Now().UnixMicro())
	f.mu.Unlock()
	h := w.Header()
	h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=10;w=%d", name, max(1, f.window)))
	h.Set("X-Request-Id", fmt.Sprint(n))
	h.Set("X-Served-By", app)
	mode := "redis"
	if f.cut(app) {
		mode = "local"
	}
	h.Set("X-RateLimit-Mode", mode)
	if !ok {
		w.WriteHeader(http.StatusTooManyRequests)
	}
}

// reset serves POST /admin/reset: every route's limiter of the key starts
// afresh (the fake ignores the policy).
func (f *fakeFleet) reset(w http.ResponseWriter, r *http.Request, app string) {
	var body struct {
		Key    string `json:"key"`
		Policy string `json:"policy"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || !strings.HasPrefix(body.Key, "k:") {
		http.Error(w, "bad reset", http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	for k := range f.limiters {
		if strings.HasSuffix(k, "|"+strings.TrimPrefix(body.Key, "k:")) {
			delete(f.limiters, k)
		}
	}
	f.mu.Unlock()
	fmt.Fprintf(w, `{"instance":%q,"key":%q,"scope":"fleet"}`, app, body.Key)
}

// fakeStack is a stack.Stack over a fakeFleet: faults only flip state.
type fakeStack struct {
	url         string
	mu          sync.Mutex
	redisDown   bool
	partitioned map[string]bool
	calls       []string
	unsupported string
	// rls is each app's rls_config_version once SetRLSConfig changed it
	// (else "rls-v0").
	rls map[string]string
	// holdAfterHeal: for this long after a partition heals, app2 holds the
	// healed instance's share back (fakeFleet.held) and its /status says
	// so, as an instance does until its next heartbeat sees the other back.
	holdAfterHeal time.Duration
	healedAt      time.Time
}

func (s *fakeStack) held(app string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return app == "app2" && s.holdAfterHeal > 0 && !s.healedAt.IsZero() && time.Since(s.healedAt) < s.holdAfterHeal
}

var _ stack.Stack = (*fakeStack)(nil)

func (s *fakeStack) record(c string) {
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
}

func (s *fakeStack) cut(app string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.redisDown || s.partitioned[app]
}

func (s *fakeStack) setDown(v bool) { s.mu.Lock(); s.redisDown = v; s.mu.Unlock() }

// fakeAdminToken is the fake stack's admin token.
const fakeAdminToken = "fake-admin-token-0123456789abcdef0123"

func (s *fakeStack) Name() string { return "fake" }
func (s *fakeStack) Up(context.Context, string) (stack.Info, error) {
	s.record("up")
	info := stack.Info{NginxURL: s.url, AdminToken: fakeAdminToken}
	for i := 1; i <= 4; i++ {
		u := fmt.Sprintf("%s/app%d", s.url, i)
		info.Apps = append(info.Apps, stack.App{Name: fmt.Sprintf("app%d", i), URL: u, AdminURL: u})
	}
	return info, nil
}
func (s *fakeStack) Down(context.Context) error  { s.record("down"); return nil }
func (s *fakeStack) Flush(context.Context) error { return nil }
func (s *fakeStack) KillRedis(context.Context) error {
	s.record("kill redis")
	s.setDown(true)
	return nil
}
func (s *fakeStack) StartRedis(_ context.Context, wipe bool) error {
	s.record(fmt.Sprintf("start redis wipe=%v", wipe))
	s.setDown(false)
	return nil
}
func (s *fakeStack) PauseRedis(context.Context) error { s.record("pause"); s.setDown(true); return nil }
func (s *fakeStack) ResumeRedis(context.Context) error {
	s.record("resume")
	s.setDown(false)
	return nil
}
func (s *fakeStack) KillApp(_ context.Context, app string) error {
	s.record("kill " + app)
	return nil
}
func (s *fakeStack) StartApp(_ context.Context, app string) error {
	s.record("start " + app)
	return nil
}
func (s *fakeStack) Partition(_ context.Context, app string, on bool) error {
	s.record(fmt.Sprintf("partition %s %v", app, on))
	s.mu.Lock()
	s.partitioned[app] = on
	if !on {
		s.healedAt = time.Now()
	}
	s.mu.Unlock()
	return nil
}
func (s *fakeStack) Latency(_ context.Context, d, jitter time.Duration) error {
	if jitter > 0 {
		s.record("latency " + d.String() + "±" + jitter.String())
	} else {
		s.record("latency " + d.String())
	}
	s.setDown(d > 0)
	return nil
}
func (s *fakeStack) SetClock(_ context.Context, app string, offset time.Duration) error {
	s.record("clock " + app + " " + offset.String())
	return nil
}
func (s *fakeStack) Status(_ context.Context, app string) ([]byte, error) {
	s.mu.Lock()
	rls := cmp.Or(s.rls[app], "rls-v0")
	s.mu.Unlock()
	suspect := 0
	if s.held(app) {
		suspect = 1
	}
	return []byte(`{"instance":"` + app + `","journal_size":0,"limiter":{"suspect_instances":` + strconv.Itoa(suspect) + `,"local_grants":5,"journal":{"granted":5,"reloaded":0,` +
		`"replayed":3,"present":1,"dropped":1,"duplicate_units":0,"pending":0}},"uncounted_requests":0,` +
		`"rls_config_version":"` + rls + `","rls_config_reload_error":""}`), nil
}
func (s *fakeStack) SetPolicies(_ context.Context, app, path string) (string, error) {
	s.record("policies " + app + " " + path)
	return "v-" + filepath.Base(path), nil
}
func (s *fakeStack) SetRLSConfig(_ context.Context, app, dir string) (string, error) {
	s.record("rls " + app + " " + dir)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rls[app] = "rls-" + filepath.Base(dir)
	return s.rls[app], nil
}
func (s *fakeStack) Unsupported(fault string) string {
	if fault == "latency" {
		return s.unsupported
	}
	return ""
}

func newFake(t *testing.T, opts ...func(*fakeFleet)) *fakeStack {
	st := &fakeStack{partitioned: map[string]bool{}, rls: map[string]string{}}
	f := &fakeFleet{limiters: map[string]ideal.Limiter{}, cut: st.cut, held: st.held}
	for _, o := range opts {
		o(f)
	}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	st.url = srv.URL
	return st
}

var quick = Durations{
	Warmup: 300 * time.Millisecond, Healthy: 400 * time.Millisecond, Fault: 500 * time.Millisecond,
	Recovery: 400 * time.Millisecond, Settle: 400 * time.Millisecond, Flap: 800 * time.Millisecond,
	Prime: 300 * time.Millisecond,
}

// lightMix is the contract's classes at under half its request rate (92
// requests/s per route, not 196): twice the polite keys, as fast, and fewer
// abusive ones. The fake fleet serves in the test process, under the race
// detector beside other packages' tests: with the contract's mix its
// answers can fall behind until whole phases end without a polite answer,
// which TestRunScenarioEndToEnd judges.
var lightMix = []loadtest.KeySpec{
	{Class: loadtest.Polite, Factor: 0.4, Count: 8},
	{Class: loadtest.Abusive, Factor: 2, Count: 1},
	{Class: loadtest.Abusive, Factor: 4, Count: 1},
}

func scenario(t *testing.T, name string) Scenario {
	t.Helper()
	s, err := Select(name)
	if err != nil || len(s) != 1 {
		t.Fatalf("Select(%q) = %v, %v", name, s, err)
	}
	return s[0]
}

// TestRunScenarioEndToEnd runs redis-kill against the fake stack: the
// phases, events, outputs and invariants (the fake fleet is one exact
// limiter, so it never over-admits, and it fails over at once).
func TestRunScenarioEndToEnd(t *testing.T) {
	st := newFake(t)
	out := t.TempDir()
	var progressLines bytes.Buffer
	cfg := Config{Stack: st, Mix: lightMix, Out: out, Durations: quick, RedisTimeout: 100 * time.Millisecond, Seed: 1, Log: io.Discard,
		Progress: progress.New(&progressLines, progress.WithTerminal(false))}
	rep := RunScenario(context.Background(), cfg, scenario(t, "redis-kill"))
	if rep.Error != "" {
		t.Fatalf("error: %s", rep.Error)
	}
	// Off a terminal, the progress is a line per phase, the prime's first.
	var phases []string
	for line := range strings.Lines(progressLines.String()) {
		name, _, _ := strings.Cut(strings.TrimPrefix(line, "progress: phase "), ",")
		phases = append(phases, name)
		if name == invariant.Fault && !strings.Contains(line, " local ") {
			t.Errorf("the fault phase's line shows no local answers: %s", line)
		}
	}
	if want := append([]string{"prime"}, invariant.PhaseNames...); !slices.Equal(phases, want) {
		t.Errorf("progress lines for %v, want %v:\n%s", phases, want, progressLines.String())
	}
	if want := []string{"up", "kill redis", "start redis wipe=false", "down"}; !slices.Equal(st.calls, want) {
		t.Errorf("stack calls %v, want %v", st.calls, want)
	}
	var names []string
	for _, p := range rep.Phases {
		names = append(names, p.Name)
		if p.EndMS <= p.StartMS {
			t.Errorf("phase %+v is empty", p)
		}
	}
	if !slices.Equal(names, invariant.PhaseNames) {
		t.Errorf("phases %v", names)
	}
	for i := 1; i < len(rep.Phases); i++ {
		if rep.Phases[i].StartMS != rep.Phases[i-1].EndMS {
			t.Errorf("phases %d and %d are not contiguous", i-1, i)
		}
	}
	fault := rep.Phases[2]
	if d := fault.EndMS - fault.StartMS; d < 500 || d > 1500 {
		t.Errorf("fault phase lasted %v ms, want about 500", d)
	}
	if len(rep.Policies) != 5 || rep.Policies["/api/gcra"].Capacity == nil || *rep.Policies["/api/gcra"].Capacity != 10 {
		t.Errorf("policies %+v", rep.Policies)
	}
	// Five routes (the four algorithms' and the lease route), five
	// invariants a phase each.
	if n := len(rep.Invariants); n != 5*(4+4+4+4+4)+1+4+2 {
		t.Errorf("%d invariant rows", n)
	}
	for _, row := range rep.Invariants {
		switch row.Name {
		case invariant.OverAdmission, invariant.PoliteLimited, invariant.Errors,
			invariant.FailoverMS, invariant.RecoveryMS, invariant.Reconciled, invariant.Uncounted:
			if !row.Pass {
				t.Errorf("row failed: %+v", row)
			}
		}
	}
	if rep.Totals.Requests == 0 || rep.Totals.ByMode["local"] == 0 || rep.Totals.ByMode["redis"] == 0 {
		t.Errorf("totals %+v", rep.Totals)
	}

	dir := filepath.Join(out, "redis-kill")
	events, err := report.ReadJSONL[invariant.Event](filepath.Join(dir, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var evs []string
	for _, e := range events {
		evs = append(evs, e.Event+":"+e.Detail)
	}
	want := []string{"phase_start:warmup", "phase_start:healthy", "phase_start:fault", "redis_down:SIGKILL",
		"redis_up:restarted with its data", "phase_start:recovery", "phase_start:settle", "run_end:"}
	if !slices.Equal(evs, want) {
		t.Errorf("events %v, want %v", evs, want)
	}
	reqs, err := report.ReadJSONL[invariant.Request](filepath.Join(dir, "requests.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != rep.Totals.Requests {
		t.Errorf("%d lines in requests.jsonl, totals say %d", len(reqs), rep.Totals.Requests)
	}
	for _, r := range reqs[:10] {
		if r.RequestID == "" || r.Instance == "" || r.Mode == "" || r.Key == "" || r.Class == "" || r.Status == 0 {
			t.Fatalf("incomplete record %+v", r)
		}
	}
	var onDisk report.Report
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &onDisk); err != nil {
		t.Fatal(err)
	}
	if onDisk.Scenario != "redis-kill" || len(onDisk.Invariants) != len(rep.Invariants) || onDisk.Pass != rep.Pass {
		t.Errorf("report.json differs from the report")
	}
	html, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil || !strings.Contains(string(html), "<svg") {
		t.Errorf("report.html: %v", err)
	}

	// Re-analysis from the files gives the same verdicts.
	again, err := Reanalyze(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, row := range again.Invariants {
		if old := rep.Invariants[i]; row.Name != old.Name || row.Pass != old.Pass || fmt.Sprint(row.Measured) != fmt.Sprint(old.Measured) {
			t.Errorf("re-analysis row %d: %+v, was %+v", i, row, old)
		}
	}
}

func TestPartitionAffectsOneApp(t *testing.T) {
	st := newFake(t)
	cfg := Config{Stack: st, Mix: lightMix, Out: t.TempDir(), Durations: quick, RedisTimeout: 100 * time.Millisecond, Log: io.Discard}
	rep := RunScenario(context.Background(), cfg, scenario(t, "partition-one"))
	if rep.Error != "" {
		t.Fatal(rep.Error)
	}
	if !slices.Equal(rep.Affected, []string{"app1"}) {
		t.Errorf("affected %v", rep.Affected)
	}
	if want := []string{"up", "partition app1 true", "partition app1 false", "down"}; !slices.Equal(st.calls, want) {
		t.Errorf("calls %v", st.calls)
	}
	if len(rep.Failover) != 1 || rep.Failover[0].FailoverMS < 0 || rep.Failover[0].RecoveryMS < 0 {
		t.Errorf("failover %+v", rep.Failover)
	}
}

func TestFlapAndCrashSequences(t *testing.T) {
	for _, tt := range []struct {
		name  string
		calls []string
	}{
		{"redis-flap", []string{"up",
			"kill redis", "start redis wipe=false", "kill redis", "start redis wipe=false",
			"kill redis", "start redis wipe=false", "kill redis", "start redis wipe=false", "down"}},
		{"redis-wipe", []string{"up", "kill redis", "start redis wipe=true", "down"}},
		{"app-crash", []string{"up", "kill redis", "kill app2", "start app2", "start redis wipe=false", "down"}},
		{"redis-pause", []string{"up", "pause", "resume", "down"}},
		{"redis-latency", []string{"up", "latency 300ms", "latency 0s", "down"}},
		{"redis-slow", []string{"up", "latency 80ms±40ms", "latency 0s", "down"}},
		{"clock-step", []string{"up", "kill redis", "clock app1 1s", "clock app1 0s", "start redis wipe=false", "down"}},
		{"client-abort", []string{"up", "down"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := newFake(t)
			d := quick
			d.Warmup, d.Healthy, d.Recovery, d.Settle = 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
			cfg := Config{Stack: st, Mix: lightMix, Out: t.TempDir(), Durations: d, RedisTimeout: 100 * time.Millisecond, Log: io.Discard}
			rep := RunScenario(context.Background(), cfg, scenario(t, tt.name))
			if rep.Error != "" {
				t.Fatal(rep.Error)
			}
			if !slices.Equal(st.calls, tt.calls) {
				t.Errorf("calls %v, want %v", st.calls, tt.calls)
			}
			if tt.name == "app-crash" && (len(rep.Statuses) != 5 || rep.Statuses[0].Final) {
				t.Errorf("statuses %+v: want the crashed incarnation's snapshot first", rep.Statuses)
			}
			if tt.name == "client-abort" {
				reqs, err := report.ReadJSONL[invariant.Request](filepath.Join(cfg.Out, tt.name, "requests.jsonl"))
				aborted := 0
				for _, r := range reqs {
					if r.Aborted {
						aborted++
					}
				}
				if err != nil || aborted == 0 || !rep.NoFault {
					t.Errorf("%d of %d requests aborted (%v), no_fault %v: want some aborted, and no fault judged", aborted, len(reqs), err, rep.NoFault)
				}
			}
		})
	}
}

func TestUnsupportedScenarioIsSkipped(t *testing.T) {
	st := newFake(t)
	st.unsupported = "no proxy here"
	out := t.TempDir()
	cfg := Config{Stack: st, Mix: lightMix, Scenarios: []Scenario{scenario(t, "redis-latency")}, Out: out, Durations: quick, Log: io.Discard}
	sum, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.calls) != 0 {
		t.Errorf("the stack was touched: %v", st.calls)
	}
	if len(sum.Scenarios) != 1 || !sum.Scenarios[0].Skipped || sum.Scenarios[0].SkipReason != "no proxy here" || sum.Scenarios[0].Pass {
		t.Errorf("summary %+v", sum)
	}
	b, err := os.ReadFile(filepath.Join(out, "redis-latency", "report.json"))
	if err != nil || !strings.Contains(string(b), `"skip_reason": "no proxy here"`) {
		t.Errorf("report.json: %v %s", err, b)
	}
	if _, err := os.Stat(filepath.Join(out, "summary.json")); err != nil {
		t.Error(err)
	}
}

func TestSelect(t *testing.T) {
	all, err := Select("")
	if err != nil || len(all) != 16 {
		t.Fatalf("Select(\"\") = %d scenarios, %v", len(all), err)
	}
	want := []string{"redis-kill", "redis-pause", "redis-flap", "redis-wipe", "redis-latency", "partition-one", "app-crash",
		"master-failover", "failover-lag", "master-failover-cluster", "shard-wipe", "redis-slow", "clock-step", "client-abort",
		"reset-partition", "reload-under-load"}
	if !slices.Equal(Names(), want) {
		t.Errorf("names %v", Names())
	}
	got, err := Select("app-crash, redis-kill")
	if err != nil || len(got) != 2 || got[0].Name != "redis-kill" || got[1].Name != "app-crash" {
		t.Errorf("Select = %v, %v", got, err)
	}
	if _, err := Select("redis-kill,nope"); err == nil {
		t.Error("an unknown scenario was accepted")
	}
}

func TestAlgorithmOf(t *testing.T) {
	for route, want := range map[string]string{
		"/api/token-bucket":           ideal.TokenBucket,
		"/api/sliding-window-log":     ideal.SlidingWindowLog,
		"/api/sliding-window-counter": ideal.SlidingWindowCounter,
		"/api/gcra":                   ideal.GCRA,
		"/api/other":                  "",
	} {
		if got := AlgorithmOf(route, "default"); got != want {
			t.Errorf("AlgorithmOf(%s) = %q, want %q", route, got, want)
		}
	}
	if got := AlgorithmOf("/api/x", "token-bucket"); got != ideal.TokenBucket {
		t.Errorf("by policy name: %q", got)
	}
}

func TestDurationDefaults(t *testing.T) {
	d := Durations{}.withDefaults(10 * time.Second)
	want := Durations{Warmup: 10 * time.Second, Healthy: 10 * time.Second, Fault: 15 * time.Second,
		Recovery: 20 * time.Second, Settle: 10 * time.Second, Flap: 20 * time.Second, Prime: 3 * time.Second}
	if d != want {
		t.Errorf("defaults %+v, want %+v", d, want)
	}
	if d := (Durations{Prime: -1}).withDefaults(10 * time.Second); d.Prime >= 0 {
		t.Errorf("a negative Prime (none) became %v", d.Prime)
	}
}

// drainingStack reports a doubt and a pending grant on app2 for its first
// polls, as an instance whose last call in settle is still in doubt.
type drainingStack struct {
	*fakeStack
	mu    sync.Mutex
	polls int
}

func (s *drainingStack) Status(ctx context.Context, app string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if app != "app2" {
		return s.fakeStack.Status(ctx, app)
	}
	s.polls++
	pending := 0
	if s.polls <= 3 {
		pending = 1
	}
	return fmt.Appendf(nil, `{"instance":"app2","limiter":{"journal":{"pending":%d,"doubts":%d}}}`, pending, pending), nil
}

// TestDrainJournalsWaitsForTheLastGrant: the final statuses are read once
// no instance holds a grant journaled or in doubt, not while the last one
// waits for its tick.
func TestDrainJournalsWaitsForTheLastGrant(t *testing.T) {
	st := &drainingStack{fakeStack: newFake(t)}
	info, _ := st.Up(context.Background(), "")
	start := time.Now()
	drainJournals(context.Background(), st, info)
	if st.polls != 4 {
		t.Errorf("app2 polled %d times, want 4 (drained at the fourth)", st.polls)
	}
	if d := time.Since(start); d >= DrainWait {
		t.Errorf("took %v: waited out DrainWait instead of returning once drained", d)
	}
}

// TestResetProbeWaitsForTheWholeLimit: after the heal, app2 holds app1's
// share back until its next heartbeat (here 400 ms, refusing everything
// meanwhile). The probe waits until app2's /status says it holds nothing
// back, and reset_held measures the store: 0. Probing at once read the
// held-back share as usage the reset had left. (A 10 s window: the probe
// must end within a window of the reset keys' first request.)
func TestResetProbeWaitsForTheWholeLimit(t *testing.T) {
	st := newFake(t, func(f *fakeFleet) { f.window = 10 })
	st.holdAfterHeal = 400 * time.Millisecond
	cfg := Config{Stack: st, Mix: lightMix, Out: t.TempDir(), Durations: quick, RedisTimeout: 100 * time.Millisecond, Log: io.Discard}
	rep := RunScenario(context.Background(), cfg, scenario(t, "reset-partition"))
	if rep.Error != "" {
		t.Fatal(rep.Error)
	}
	if len(rep.ResetChecks) != 2 {
		t.Fatalf("checks %+v, want two", rep.ResetChecks)
	}
	for _, c := range rep.ResetChecks {
		if c.Measured != 0 || c.Probe == 0 {
			t.Errorf("check %+v: want the probe admitted and reset_held 0", c)
		}
	}
}

// TestResetPartition runs reset-partition against the fake fleet, whose
// exact limiters forget a key at once when it is reset: both reset keys'
// requests are sequenced around their resets, probed through app2 after
// the heal, and reset_held measures 0.
func TestResetPartition(t *testing.T) {
	st := newFake(t)
	cfg := Config{Stack: st, Mix: lightMix, Out: t.TempDir(), Durations: quick, RedisTimeout: 100 * time.Millisecond, Log: io.Discard}
	rep := RunScenario(context.Background(), cfg, scenario(t, "reset-partition"))
	if rep.Error != "" {
		t.Fatal(rep.Error)
	}
	if want := []string{"up", "partition app1 true", "partition app1 false", "down"}; !slices.Equal(st.calls, want) {
		t.Errorf("calls %v, want %v", st.calls, want)
	}
	var evs []string
	for _, e := range rep.Events {
		switch e.Event {
		case invariant.EventReset, invariant.EventResetProbe:
			evs = append(evs, e.Event+" "+e.Instance+" "+e.Policy)
			if e.Key == "" || e.Route != ResetRoute || e.TSendMS <= 0 || e.TRecvMS < e.TSendMS {
				t.Errorf("event %+v: want its key, route and bracket", e)
			}
		case "partition_start", "partition_end", "reset_probe_skipped":
			evs = append(evs, e.Event)
		}
	}
	want := []string{"partition_start", "reset app2 sliding-window-log", "reset app2 ", "partition_end",
		"reset_probe app2 ", "reset_probe app2 "}
	if !slices.Equal(evs, want) {
		t.Errorf("events %q, want %q", evs, want)
	}
	rows := 0
	for _, row := range rep.Invariants {
		if row.Name == invariant.ResetHeld {
			rows++
			if !row.Pass || row.Route != ResetRoute || row.Phase != invariant.Recovery {
				t.Errorf("row %+v: want a pass on %s in recovery", row, ResetRoute)
			}
		}
		if row.Name == invariant.OverAdmission && !row.Pass {
			t.Errorf("row failed: %+v (the reset keys' fresh quotas are judged apart)", row)
		}
	}
	if rows != 1 || len(rep.ResetChecks) != 2 {
		t.Fatalf("%d reset_held rows, checks %+v", rows, rep.ResetChecks)
	}
	for _, c := range rep.ResetChecks {
		// The fake's quota is 10: 2 requests before the reset, 1 after.
		if c.Before != 2 || c.After != 1 || c.InStore != 1 || c.Measured != 0 {
			t.Errorf("check %+v", c)
		}
	}
}

// TestReloadUnderLoad: every app gets the first policy file before the
// load, and the second one at a time during the Redis outage, each
// reload recorded with its bracket.
func TestReloadUnderLoad(t *testing.T) {
	st := newFake(t)
	d := quick
	d.Fault = 800 * time.Millisecond
	cfg := Config{Stack: st, Mix: lightMix, Out: t.TempDir(), Durations: d, RedisTimeout: 100 * time.Millisecond, Log: io.Discard}
	rep := RunScenario(context.Background(), cfg, scenario(t, "reload-under-load"))
	if rep.Error != "" {
		t.Fatal(rep.Error)
	}
	want := []string{"up"}
	for i := 1; i <= 4; i++ {
		want = append(want, fmt.Sprintf("policies app%d %s", i, ReloadBefore))
	}
	want = append(want, "kill redis")
	for i := 1; i <= 4; i++ {
		want = append(want, fmt.Sprintf("rls app%d %s", i, ReloadRLS), fmt.Sprintf("policies app%d %s", i, ReloadAfter))
	}
	want = append(want, "start redis wipe=false", "down")
	if !slices.Equal(st.calls, want) {
		t.Errorf("calls %v, want %v", st.calls, want)
	}
	var reloads, rlsReloads []string
	for _, e := range rep.Events {
		switch e.Event {
		case invariant.EventReload:
			reloads = append(reloads, e.Instance)
		case invariant.EventRLSReload:
			rlsReloads = append(rlsReloads, e.Instance)
			if e.Version != "rls-rls" || e.Route != RLSRoute {
				t.Errorf("RLS reload %+v: want version rls-rls on %s", e, RLSRoute)
			}
		default:
			continue
		}
		if e.TSendMS <= 0 || e.TRecvMS < e.TSendMS {
			t.Errorf("reload %+v: no bracket", e)
		}
	}
	apps := []string{"app1", "app2", "app3", "app4"}
	if !slices.Equal(reloads, apps) || !slices.Equal(rlsReloads, apps) {
		t.Errorf("reloads %v, RLS reloads %v", reloads, rlsReloads)
	}
	// rls_config_reloaded: every app runs the new version after settle.
	// The fake fleet has no rate limit service, so the door is not
	// judged and no door request is asked for.
	rows := 0
	for _, row := range rep.Invariants {
		if row.Name == invariant.RLSConfig {
			rows++
			if !row.Pass || row.Route != RLSRoute || row.Phase != invariant.Settle {
				t.Errorf("row %+v", row)
			}
		}
	}
	if rows != 1 || len(rep.RLSConfigChecks) != 4 {
		t.Fatalf("%d rls_config_reloaded rows, checks %+v", rows, rep.RLSConfigChecks)
	}
	for _, c := range rep.RLSConfigChecks {
		if c.Before != "rls-v0" || c.Changed != "rls-rls" || c.Final != "rls-rls" || c.Problem != "" {
			t.Errorf("check %+v", c)
		}
	}
}
