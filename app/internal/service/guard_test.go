package service

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestDemoMode: with the published secret and RL_DEMO=true the service
// starts, warns, and says so in /status and /metrics; without RL_DEMO it
// says it is not in demo mode (and LoadConfig refuses the secret:
// TestLoadConfigErrors).
func TestDemoMode(t *testing.T) {
	for _, demo := range []bool{true, false} {
		env := map[string]string{}
		if demo {
			env = map[string]string{"RL_DEMO": "true", "RL_API_KEY_SECRET": DemoAPIKeySecret}
		}
		s, logs := startServer(t, env)
		admin := "http://" + s.AdminAddr()
		_, body := get(t, admin+"/status")
		var st Status
		if err := json.Unmarshal(body, &st); err != nil || st.DemoMode != demo || !bytes.Contains(body, []byte(`"demo_mode":`)) {
			t.Errorf("demo %v: /status %s (%v)", demo, body, err)
		}
		_, body = get(t, admin+"/metrics")
		want := "ratelimit_demo_mode 0"
		if demo {
			want = "ratelimit_demo_mode 1"
		}
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("demo %v: /metrics lacks %q:\n%s", demo, want, grep(body, "fleetlimit_"))
		}
		if warned := strings.Contains(logs.String(), `"level":"WARN","msg":"demo mode`); warned != demo {
			t.Errorf("demo %v: warned %v:\n%s", demo, warned, logs)
		}
	}
}

// TestPprofOnlyWhenAsked: the profiler answers on the admin port only with
// RL_PPROF=true.
func TestPprofOnlyWhenAsked(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want int
	}{{nil, http.StatusNotFound}, {map[string]string{"RL_PPROF": "true"}, http.StatusOK}} {
		s, _ := startServer(t, c.env)
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/symbol"} {
			if resp, _ := get(t, "http://"+s.AdminAddr()+path); resp.StatusCode != c.want {
				t.Errorf("%v: %s answered %d, want %d", c.env, path, resp.StatusCode, c.want)
			}
		}
	}
}

// TestAdminListensOnLoopbackByDefault: without RL_ADMIN_ADDR the admin port
// is 127.0.0.1:9090, not every interface.
func TestAdminListensOnLoopbackByDefault(t *testing.T) {
	cfg, err := LoadConfig(envOf(map[string]string{"RL_INSTANCE": "a"}))
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(cfg.AdminAddr)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		t.Errorf("RL_ADMIN_ADDR default %q (%v), want a loopback address", cfg.AdminAddr, err)
	}
}

// TestRequestIDTrustedOnlyWhenAsked: X-Request-Id from a trusted proxy is
// the request's id only with RL_TRUST_REQUEST_ID=true; otherwise each
// request gets its own, and sending one id twice counts twice.
func TestRequestIDTrustedOnlyWhenAsked(t *testing.T) {
	for _, trust := range []bool{false, true} {
		env := map[string]string{}
		if trust {
			env["RL_TRUST_REQUEST_ID"] = "true"
		}
		s, _ := startServer(t, env)
		var remaining []string
		for range 2 {
			resp, body := get(t, "http://"+s.PublicAddr()+"/api/sliding-window-log", "X-API-Key", "ids", "X-Request-Id", "resent-1")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if got := resp.Header.Get("X-Request-Id"); (got == "resent-1") != trust {
				t.Errorf("trust %v: X-Request-Id %q", trust, got)
			}
			remaining = append(remaining, resp.Header.Get("X-RateLimit-Remaining"))
		}
		// Memory mode counts every request: the resend window is the
		// Redis scripts' (redisstore and resilient tests).
		if remaining[0] != "99" || remaining[1] != "98" {
			t.Errorf("trust %v: remaining %v", trust, remaining)
		}
	}
}
