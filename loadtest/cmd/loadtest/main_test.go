package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunWritesRecords(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Served-By", "app1")
		w.Header().Set("X-RateLimit-Mode", "redis")
		w.Header().Set("X-Request-Id", "id")
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "requests.jsonl")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-url", srv.URL, "-routes", "/api/gcra", "-quota", "50", "-window", "1s",
		"-duration", "300ms", "-out", out, "-run-id", "cli"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v; %s", err, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 30 {
		t.Fatalf("%d records", len(lines))
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"t_send_ms", "t_recv_ms", "route", "key", "class", "status", "request_id", "instance", "mode", "latency_ms"} {
		if _, ok := rec[k]; !ok {
			t.Errorf("record lacks %q: %v", k, rec)
		}
	}
	if !strings.Contains(stdout.String(), "run cli:") || !strings.Contains(stdout.String(), "/api/gcra abusive") {
		t.Errorf("summary: %s", stdout.String())
	}
}

// TestSummaryNamesTheRefusingPolicy: the summary says which policy refused
// each route's 429s, and warns when polite keys were refused by a policy
// other than the route's own (here a stand-in for the per-address ceiling
// refuses every polite request; the route's policy the abusive ones).
func TestSummaryNamesTheRefusingPolicy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		policy := "per-address"
		switch {
		case strings.HasPrefix(key, "probe-"):
			w.Header().Set("RateLimit-Policy", `"gcra";q=50;w=1, "per-address";q=100;w=1`)
			return
		case strings.HasPrefix(key, "abusive-"):
			policy = "gcra"
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, `{"status":429,"policy":%q}`, policy)
	}))
	defer srv.Close()
	// By default each key sends from an address of its own: a ceiling
	// that still refuses them saw fewer (a port proxy). From one address
	// (-sources 0), the ceiling refuses the load as it should.
	for sources, why := range map[string]string{"-1": "port proxy", "0": "This load comes from one address"} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), []string{"-url", srv.URL, "-routes", "/api/gcra", "-duration", "300ms", "-sources", sources,
			"-out", filepath.Join(t.TempDir(), "r.jsonl"), "-run-id", "cli", "-api-key-secret", ""}, &stdout, &stderr)
		if err != nil {
			t.Fatalf("%v; %s", err, stderr.String())
		}
		out := stdout.String()
		for _, want := range []string{
			`/api/gcra polite`, `(429 by per-address `,
			`/api/gcra abusive`, `(429 by gcra `,
			`polite requests were refused by "per-address" (`, why, `loadtest/README.md`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("-sources %s: summary lacks %q:\n%s", sources, want, out)
			}
		}
		// Off a terminal: a line per phase on stderr.
		for _, phase := range []string{"phase learn", "phase load", "phase drain"} {
			if !strings.Contains(stderr.String(), phase) {
				t.Errorf("stderr lacks %q:\n%s", phase, stderr.String())
			}
		}
	}
}

func TestRunFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"-quota", "5"}, &stdout, &stderr); err == nil {
		t.Error("-quota without -window accepted")
	}
	if err := run(context.Background(), []string{"-url", "http://10.1.2.3:8080", "-out", filepath.Join(t.TempDir(), "x")}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("non-loopback target: %v", err)
	}
}
