package service

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// TestAdminToken: with RL_ADMIN_TOKEN set, /admin/* and /debug/* answer 401
// with a problem body to a request without one of its tokens (either of
// two, for a rotation), count it and log it without the token; /healthz,
// /readyz, /metrics and /status stay open.
func TestAdminToken(t *testing.T) {
	const t1, t2 = "token-one-0123456789abcdef0123456789", "token-two-0123456789abcdef0123456789"
	s, logs := startServer(t, map[string]string{"RL_ADMIN_TOKEN": t1 + "," + t2, "RL_PPROF": "true"})
	admin := "http://" + s.AdminAddr()
	do := func(method, path, token string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, admin+path, strings.NewReader(`{"key": "k:a"}`))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, c := range []struct {
		method, path, token string
		want                int
	}{
		{"POST", "/admin/reset", "", http.StatusUnauthorized},
		{"POST", "/admin/reset", "wrong-0123456789abcdef0123456789abcd", http.StatusUnauthorized},
		{"POST", "/admin/reset", t1[:len(t1)-1], http.StatusUnauthorized},
		{"GET", "/debug/pprof/", "", http.StatusUnauthorized},
		{"GET", "/debug/pprof/", t2, http.StatusOK},
		{"GET", "/healthz", "", http.StatusOK},
		{"GET", "/readyz", "", http.StatusOK},
		{"GET", "/metrics", "", http.StatusOK},
		{"GET", "/status", "", http.StatusOK},
	} {
		resp := do(c.method, c.path, c.token)
		if resp.StatusCode != c.want {
			t.Errorf("%s %s with %q: %d, want %d", c.method, c.path, c.token, resp.StatusCode, c.want)
		}
		if c.want == http.StatusUnauthorized && (resp.Header.Get("Content-Type") != "application/problem+json" || resp.Header.Get("WWW-Authenticate") == "") {
			t.Errorf("%s %s: 401 with %v, want a problem body and WWW-Authenticate", c.method, c.path, resp.Header)
		}
	}
	for _, tok := range []string{t1, t2} {
		if resp := do("POST", "/admin/reset", tok); resp.StatusCode == http.StatusUnauthorized {
			t.Errorf("reset with a valid token: %d", resp.StatusCode)
		}
	}
	_, body := get(t, admin+"/metrics")
	if !bytes.Contains(body, []byte("ratelimit_admin_unauthorized_total 4")) {
		t.Errorf("/metrics: %s, want 4 refused", grep(body, "ratelimit_admin_unauthorized"))
	}
	if out := logs.String(); !strings.Contains(out, "admin request refused") || strings.Contains(out, "wrong-0123") || strings.Contains(out, t1[:20]) {
		t.Errorf("logs: want the refusals logged without any token:\n%s", out)
	}
}
