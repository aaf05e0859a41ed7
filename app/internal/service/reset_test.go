package service

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func post(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// TestAdminReset (memory mode): a key spent on a route is admitted again
// after POST /admin/reset of its policy; another identity's state is
// untouched; a body, key or policy that cannot be used gets a 400 problem
// and resets nothing.
func TestAdminReset(t *testing.T) {
	s, logs := startServer(t, nil)
	api, admin := "http://"+s.PublicAddr()+"/api/sliding-window-log", "http://"+s.AdminAddr()+"/admin/reset"
	spend := func(id string) {
		for {
			if resp, _ := get(t, api, "X-API-Key", id); resp.StatusCode == 429 {
				return
			}
		}
	}
	spend("spent")
	spend("other")
	for _, body := range []string{
		`{"key": "k:spent", "policy": "no-such-policy"}`,
		`{"key": "spent", "policy": "sliding-window-log"}`,
		`{"key": "k:not an id"}`,
		`{"key": "ip:999.1.1.1"}`,
		`{"key": "k:spent", "polcy": "sliding-window-log"}`,
		`not json`,
		`{"key": "k:` + strings.Repeat("a", 5000) + `"}`,
	} {
		resp, b := post(t, admin, body)
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" ||
			json.Unmarshal(b, &p) != nil || p.Status != 400 || !strings.HasSuffix(p.Type, "#invalid-request") || p.Detail == "" {
			t.Errorf("%.40s: %d %s %s, want a 400 problem", body, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	}
	if resp, _ := get(t, api, "X-API-Key", "spent"); resp.StatusCode != 429 {
		t.Fatalf("a bad reset lifted the limit: %d", resp.StatusCode)
	}

	resp, b := post(t, admin, `{"key": "k:spent", "policy": "sliding-window-log"}`)
	var got resetResponse
	if err := json.Unmarshal(b, &got); err != nil || resp.StatusCode != 200 || got.Key != "k:spent" ||
		got.Scope != "instance" || got.Partial || len(got.Policies) != 1 || got.Policies[0] != "sliding-window-log" {
		t.Fatalf("reset: %d %s (%v)", resp.StatusCode, b, err)
	}
	if resp, body := get(t, api, "X-API-Key", "spent"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "99" {
		t.Errorf("after the reset: %d, remaining %s: %s", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), body)
	}
	if resp, _ := get(t, api, "X-API-Key", "other"); resp.StatusCode != 429 {
		t.Errorf("another key after the reset: %d, want still 429", resp.StatusCode)
	}
	// Every policy: the per-address ceiling too (an address identity).
	if resp, b := post(t, admin, `{"key": "ip:127.0.0.1"}`); resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"per-address"`)) {
		t.Errorf("reset of every policy: %d %s", resp.StatusCode, b)
	}
	_, body := get(t, "http://"+s.AdminAddr()+"/metrics")
	for _, want := range []string{`ratelimit_admin_resets_total{result="instance"} 2`, `ratelimit_admin_resets_total{result="invalid"} 7`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %s:\n%s", want, grep(body, "resets"))
		}
	}
	if !strings.Contains(logs.String(), `"msg":"limits reset","instance":"test-1","key":"k:spent"`) {
		t.Errorf("the reset was not logged:\n%s", logs)
	}
}

// TestAdminResetPartial: with Redis unreachable a reset holds on this
// instance only: 503, partial, and the key is admitted from a fresh local
// share.
func TestAdminResetPartial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	s, _ := startServer(t, map[string]string{"RL_REDIS_URL": "redis://" + dead + "/0", "RL_EXPECTED_INSTANCES": "4", "RL_DEBUG_HEADERS": "true"})
	api := "http://" + s.PublicAddr() + "/api/gcra"
	for {
		if resp, _ := get(t, api, "X-API-Key", "spent"); resp.StatusCode == 429 {
			break
		}
	}
	resp, b := post(t, "http://"+s.AdminAddr()+"/admin/reset", `{"key": "k:spent", "policy": "gcra"}`)
	var got resetResponse
	if err := json.Unmarshal(b, &got); err != nil || resp.StatusCode != 503 || !got.Partial || got.Scope != "instance" || got.Detail == "" {
		t.Fatalf("reset with Redis out: %d %s (%v), want 503 and partial", resp.StatusCode, b, err)
	}
	if resp, body := get(t, api, "X-API-Key", "spent"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Mode") != "local" {
		t.Errorf("after a partial reset: %d %s, want admitted locally", resp.StatusCode, body)
	}
	_, body := get(t, "http://"+s.AdminAddr()+"/status")
	if !bytes.Contains(body, []byte(`"resets_applied":1`)) {
		t.Errorf("/status does not count the reset: %s", body)
	}
}
