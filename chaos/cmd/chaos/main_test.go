package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func noenv(string) string { return "" }

func TestFlags(t *testing.T) {
	ctx := context.Background()
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"-stack", "nope", "-root", t.TempDir()}, noenv, &out, &errOut); err == nil || !strings.Contains(err.Error(), "local or compose") {
		t.Errorf("-stack nope: %v", err)
	}
	if err := run(ctx, []string{"-scenarios", "redis-kill,nope"}, noenv, &out, &errOut); err == nil || !strings.Contains(err.Error(), "unknown scenario") {
		t.Errorf("unknown scenario: %v", err)
	}
	env := func(k string) string {
		if k == "SCENARIOS" {
			return "bogus"
		}
		return ""
	}
	if err := run(ctx, nil, env, &out, &errOut); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("$SCENARIOS is not read: %v", err)
	}
}

// TestReanalyze recomputes a hand-made run: a sliding window log route
// that admits 110 requests of one key within one second of healthy.
func TestReanalyze(t *testing.T) {
	out := t.TempDir()
	dir := filepath.Join(out, "redis-kill")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const t0 = 1_700_000_000_000.0
	rep := map[string]any{
		"scenario": "redis-kill", "stack": "local",
		"policies": map[string]any{"/api/sliding-window-log": map[string]any{"algorithm": "sliding_window_log", "limit": 100, "window_ms": 10000}},
		"phases": []map[string]any{
			{"name": "warmup", "start_ms": t0, "end_ms": t0 + 10000},
			{"name": "healthy", "start_ms": t0 + 10000, "end_ms": t0 + 20000},
			{"name": "fault", "start_ms": t0 + 20000, "end_ms": t0 + 35000},
			{"name": "recovery", "start_ms": t0 + 35000, "end_ms": t0 + 55000},
			{"name": "settle", "start_ms": t0 + 55000, "end_ms": t0 + 65000},
		},
		"redis_timeout_ms": 100, "pass": true,
	}
	b, _ := json.Marshal(rep)
	if err := os.WriteFile(filepath.Join(dir, "report.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	var lines bytes.Buffer
	for i := range 110 {
		s := t0 + 10000 + float64(i)*5
		line, _ := json.Marshal(map[string]any{"t_send_ms": s, "t_recv_ms": s + 1, "route": "/api/sliding-window-log",
			"key": "abusive-swl-1-x", "class": "abusive", "status": 200, "request_id": "r", "instance": "app1", "mode": "redis", "latency_ms": 1})
		lines.Write(append(line, '\n'))
	}
	if err := os.WriteFile(filepath.Join(dir, "requests.jsonl"), lines.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-reanalyze", "-out", out}, noenv, &stdout, &stderr)
	if !errors.Is(err, errFailed) {
		t.Fatalf("err = %v, want the invariants to fail; %s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "redis-kill") || !strings.Contains(stdout.String(), "overall: FAIL") {
		t.Errorf("stdout: %s", stdout.String())
	}
	var got struct {
		Invariants []struct {
			Name, Route, Phase string
			Measured           any
			Pass               bool
		}
	}
	b, err = os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range got.Invariants {
		if r.Name == "over_admission" && r.Phase == "healthy" {
			found = true
			if r.Measured != 1.1 || r.Pass {
				t.Errorf("over_admission in healthy: %+v, want 1.1 failing", r)
			}
		}
	}
	if !found {
		t.Error("no over_admission row")
	}
	for _, f := range []string{"summary.json", "redis-kill/report.html"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}
