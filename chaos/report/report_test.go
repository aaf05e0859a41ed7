package report

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
	"github.com/fleetlimit/fleetlimit/chaos/invariant"
)

const t0 = 1_700_000_000_000.0

func sample() (*Report, []invariant.Request) {
	policies := map[string]invariant.Policy{
		"/api/token-bucket":       {Name: "token-bucket", Algorithm: ideal.TokenBucket, Limit: 100, Capacity: 100, Window: 10 * time.Second},
		"/api/sliding-window-log": {Name: "sliding-window-log", Algorithm: ideal.SlidingWindowLog, Limit: 100, Window: 10 * time.Second},
	}
	r := &Report{
		Scenario: "redis-kill", Fault: "SIGKILL Redis", Stack: "local", RunID: "redis-kill-abc",
		Policies: map[string]Policy{},
		Phases: []invariant.Phase{
			{Name: invariant.Warmup, StartMS: t0, EndMS: t0 + 10_000},
			{Name: invariant.Healthy, StartMS: t0 + 10_000, EndMS: t0 + 20_000},
			{Name: invariant.Fault, StartMS: t0 + 20_000, EndMS: t0 + 35_000},
			{Name: invariant.Recovery, StartMS: t0 + 35_000, EndMS: t0 + 55_000},
			{Name: invariant.Settle, StartMS: t0 + 55_000, EndMS: t0 + 65_000},
		},
		Events: []invariant.Event{
			{TMS: t0 + 20_000, Event: "redis_down", Detail: "SIGKILL"},
			{TMS: t0 + 35_000, Event: "redis_up", Detail: "restarted with its data"},
		},
		Invariants: []invariant.Row{
			{Name: invariant.OverAdmission, Route: "/api/token-bucket", Phase: invariant.Fault, Measured: 1.03, Bound: 1.1, Pass: true},
			{Name: invariant.Goodput, Route: "/api/token-bucket", Phase: invariant.Healthy, Measured: 0.5, Bound: 0.9, Pass: false},
			{Name: invariant.Reconciled, Route: invariant.AllRoutes, Phase: invariant.Settle, Measured: "status fields missing: replayed <b>", Bound: invariant.ReconciledBound},
		},
	}
	for route, p := range policies {
		r.Policies[route] = PolicyOf(p)
	}
	var reqs []invariant.Request
	for i := range 650 {
		ms := t0 + float64(i)*100
		mode, inst := "redis", "app"+string(rune('1'+i%4))
		if ms >= t0+20_000 && ms < t0+35_000 {
			mode = "local"
		}
		st := 200
		if i%3 == 0 {
			st = 429
		}
		reqs = append(reqs, invariant.Request{TSendMS: ms, TRecvMS: ms + 2, Route: "/api/token-bucket", Key: "k", Class: "abusive", Status: st, Instance: inst, Mode: mode, LatencyMS: 2})
	}
	r.Totals = invariant.ComputeTotals(reqs, r.Phases)
	r.Judge()
	return r, reqs
}

func TestReportJSONShape(t *testing.T) {
	r, _ := sample()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"scenario", "policies", "phases", "totals", "invariants", "pass"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("report.json lacks %q", k)
		}
	}
	if doc["pass"] != false {
		t.Errorf("pass = %v with a failing row", doc["pass"])
	}
	pol := doc["policies"].(map[string]any)
	tb := pol["/api/token-bucket"].(map[string]any)
	if tb["algorithm"] != "token_bucket" || tb["capacity"] != 100.0 || tb["refill_per_s"] != 10.0 || tb["limit"] != nil || tb["window_ms"] != nil {
		t.Errorf("token bucket policy %v", tb)
	}
	swl := pol["/api/sliding-window-log"].(map[string]any)
	if swl["algorithm"] != "sliding_window_log" || swl["limit"] != 100.0 || swl["window_ms"] != 10000.0 || swl["capacity"] != nil {
		t.Errorf("sliding window log policy %v", swl)
	}
	ph := doc["phases"].([]any)[2].(map[string]any)
	if ph["name"] != "fault" || ph["start_ms"] != t0+20_000 || ph["end_ms"] != t0+35_000 {
		t.Errorf("phase %v", ph)
	}
	for _, row := range doc["invariants"].([]any) {
		m := row.(map[string]any)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, []string{"bound", "measured", "name", "pass", "phase", "route"}) {
			t.Errorf("invariant row keys %v", keys)
		}
	}
	totals := doc["totals"].(map[string]any)
	if totals["requests"] != 650.0 || totals["by_phase"] == nil || totals["by_route"] == nil {
		t.Errorf("totals %v", totals)
	}
	// The policies come back for the invariants.
	jp := r.JudgedPolicies()
	if p := jp["/api/token-bucket"]; p.Limit != 100 || p.Capacity != 100 || p.Window != 10*time.Second || p.Algorithm != ideal.TokenBucket {
		t.Errorf("judged token bucket %+v", p)
	}
	if p := jp["/api/sliding-window-log"]; p.Limit != 100 || p.Window != 10*time.Second {
		t.Errorf("judged window log %+v", p)
	}
}

func TestSummary(t *testing.T) {
	pass := &Report{Scenario: "redis-kill", Invariants: []invariant.Row{{Name: "errors", Pass: true}}}
	pass.Judge()
	fail := &Report{Scenario: "redis-pause", Invariants: []invariant.Row{{Name: "errors", Route: "/r", Phase: "fault", Pass: false}}}
	fail.Judge()
	skip := &Report{Scenario: "redis-latency", Skipped: true, SkipReason: "no proxy"}
	skip.Judge()
	broken := &Report{Scenario: "app-crash", Error: "starting the stack: boom"}
	broken.Judge()

	s := Summarize("compose", []*Report{pass, skip})
	if !s.Pass || !slices.Equal(s.Skipped, []string{"redis-latency"}) {
		t.Errorf("pass and skip: %+v", s)
	}
	if s := Summarize("local", []*Report{pass, fail}); s.Pass || !slices.Equal(s.Scenarios[1].Failed, []string{"errors /r fault"}) {
		t.Errorf("with a failure: %+v", s)
	}
	if s := Summarize("local", []*Report{pass, broken}); s.Pass || s.Scenarios[1].Pass || s.Scenarios[1].Error == "" {
		t.Errorf("with an error: %+v", s)
	}
	if s := Summarize("compose", []*Report{skip}); s.Pass {
		t.Errorf("nothing ran, yet pass: %+v", s)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "summary.json")
	if err := WriteJSON(path, Summarize("local", []*Report{pass, fail, skip})); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	var doc struct {
		Scenarios []map[string]any `json:"scenarios"`
		Pass      *bool            `json:"pass"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Pass == nil || *doc.Pass || len(doc.Scenarios) != 3 {
		t.Fatalf("summary.json %s", b)
	}
	for _, sc := range doc.Scenarios {
		if _, ok := sc["name"].(string); !ok {
			t.Errorf("scenario without a name: %v", sc)
		}
		if _, ok := sc["pass"].(bool); !ok {
			t.Errorf("scenario without pass: %v", sc)
		}
	}
	if doc.Scenarios[2]["skipped"] != true || doc.Scenarios[2]["skip_reason"] != "no proxy" {
		t.Errorf("skipped scenario %v", doc.Scenarios[2])
	}
}

func TestRenderHTML(t *testing.T) {
	r, reqs := sample()
	var buf bytes.Buffer
	if err := RenderHTML(&buf, r, reqs); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, want := range []string{
		"<!DOCTYPE html>", "<svg", "<polyline", "<table", "<th>invariant</th>",
		"over_admission", "goodput", "FAIL", "redis_down", "app1", "app4",
		"fault phase", // the shading's title
		"/api/token-bucket (token_bucket, capacity 100, refill 10/s)",
		"/api/sliding-window-log (sliding_window_log, limit 100 per 10000 ms)",
		"≥ 0.9", "≤ 1.1",
		`fill="#f9a825"`, // a band in local mode
		`fill="#2e7d32"`, // a band in redis mode
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page, "replayed <b>") || !strings.Contains(page, "replayed &lt;b&gt;") {
		t.Error("a measured string went into the page unescaped")
	}
	for _, bad := range []string{"<script", "<link", "src=", "@import"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page is not self-contained: %q", bad)
		}
	}
	if n := strings.Count(page, "<svg"); n != 3 { // two routes and the mode bands
		t.Errorf("%d charts, want 3", n)
	}
}

func TestRenderHTMLSkipped(t *testing.T) {
	r := &Report{Scenario: "redis-latency", Stack: "compose", Skipped: true, SkipReason: "no proxy in compose"}
	r.Judge()
	var buf bytes.Buffer
	if err := RenderHTML(&buf, r, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "SKIPPED") || !strings.Contains(buf.String(), "no proxy in compose") {
		t.Error("the skipped page does not say so")
	}
}

func TestJSONLRoundTrip(t *testing.T) {
	_, reqs := sample()
	path := filepath.Join(t.TempDir(), "requests.jsonl")
	if err := WriteJSONL(path, reqs); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSONL[invariant.Request](path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, reqs) {
		t.Error("requests changed through requests.jsonl")
	}
}

func TestFormatValue(t *testing.T) {
	for _, tt := range []struct {
		in   any
		want string
	}{
		{1.1, "1.1"}, {0, "0"}, {"x", "x"}, {nil, "—"},
		{invariant.Reconciliation{GrantedLocally: 3, Replayed: 3}, "local_grants 3 + inherited 0 - handed_over 0 = replayed 3 (present 0) + dropped_expired 0 + duplicates_refused 0 + journaled 0; imbalance 0"},
	} {
		if got := FormatValue(tt.in); got != tt.want {
			t.Errorf("FormatValue(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
