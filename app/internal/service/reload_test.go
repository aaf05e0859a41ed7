package service

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// reloadPolicies is a policy file with one route whose policy has the given
// limit (and a second route, /api/new, when withNew is set).
func reloadPolicies(limit int, withNew bool) string {
	routes := `{"pattern": "/api/*", "policies": ["p"]}`
	if withNew {
		routes += `, {"pattern": "/api/new", "policies": ["p", "ceiling"]}`
	}
	return `{"policies": [
	  {"name": "p", "algorithm": "sliding_window_counter", "limit": ` + strconv.Itoa(limit) + `, "window": "10s"},
	  {"name": "ceiling", "algorithm": "sliding_window_counter", "limit": 1000, "window": "10s", "per": "address"}
	], "routes": [` + routes + `]}`
}

// writeFile replaces path's content the way editors do: a new file renamed
// over the old one.
func writeFile(t *testing.T, path, body string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// eventually calls f every 10 ms until it returns "" or 5 s have passed,
// then fails with f's last complaint.
func eventually(t *testing.T, f func() string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		why := f()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within 5 s: %s", why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type policyStatusBody struct {
	PolicyStatus
	Instance string `json:"instance"`
}

func statusOf(t *testing.T, s *Server) policyStatusBody {
	t.Helper()
	_, body := get(t, "http://"+s.AdminAddr()+"/status")
	var st policyStatusBody
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("/status %s: %v", body, err)
	}
	return st
}

// TestReloadOnFileChange changes RL_POLICY_FILE under a running service:
// within a few polls clients see the new RateLimit-Policy and the new
// route, a key that used the old policy keeps its usage under the new
// limit, and /status and the metrics show the new version.
// A bad file then changes nothing and says why; a good one clears that.
func TestReloadOnFileChange(t *testing.T) {
	path := writePolicyFile(t, reloadPolicies(100, false))
	s, logs := startServer(t, map[string]string{
		"RL_POLICY_FILE": path, "RL_HEARTBEAT_INTERVAL": "20ms", "RL_HEARTBEAT_TTL": "100ms",
	})
	base := "http://" + s.PublicAddr()
	first := statusOf(t, s)
	if first.PolicyVersion == "" || first.PolicyFile != path || first.PolicyReloadError != "" {
		t.Fatalf("/status at start: %+v", first)
	}
	for range 3 {
		get(t, base+"/api/x", "X-API-Key", "reloaded")
	}
	// /api/new is served by /api/* until the reload adds its own route.
	if resp, _ := get(t, base+"/api/new", "X-API-Key", "other"); resp.Header.Get("RateLimit-Policy") != `"p";q=100;w=10` {
		t.Fatalf("/api/new before the reload: %d %v", resp.StatusCode, resp.Header)
	}

	writeFile(t, path, reloadPolicies(5, true))
	eventually(t, func() string {
		resp, _ := get(t, base+"/api/new", "X-API-Key", "other")
		if got := resp.Header.Get("RateLimit-Policy"); got != `"p";q=5;w=10, "ceiling";q=1000;w=10` {
			return "RateLimit-Policy of /api/new: " + got
		}
		return ""
	})
	// The key had used 3 of the old 100; they count against the new 5.
	resp, _ := get(t, base+"/api/x", "X-API-Key", "reloaded")
	if got := resp.Header.Get("RateLimit"); !strings.HasPrefix(got, `"p";r=1;`) {
		t.Errorf("RateLimit after the reload = %q, want r=1 (the 3 units used before it, and this one, of 5)", got)
	}
	second := statusOf(t, s)
	if second.PolicyVersion == first.PolicyVersion || second.PolicyReloads == 0 || second.PolicyReloadError != "" {
		t.Errorf("/status after the reload: %+v (first %+v)", second, first)
	}
	_, metrics := get(t, "http://"+s.AdminAddr()+"/metrics")
	for _, want := range []string{
		`ratelimit_policy_info{version="` + second.PolicyVersion + `"} 1`,
		`ratelimit_policy_reload_errors_total 0`,
		`ratelimit_policy_last_reload_success 1`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grep(metrics, "fleetlimit_"))
		}
	}
	if strings.Contains(string(metrics), first.PolicyVersion) {
		t.Errorf("/metrics still names the old version %s", first.PolicyVersion)
	}

	// A bad file: the policies in force stay.
	writeFile(t, path, strings.Replace(reloadPolicies(7, true), `"limit": 7`, `"limt": 7`, 1))
	eventually(t, func() string {
		if st := statusOf(t, s); !strings.Contains(st.PolicyReloadError, `unknown field "limt"`) {
			return "policy_reload_error = " + st.PolicyReloadError
		}
		return ""
	})
	if st := statusOf(t, s); st.PolicyVersion != second.PolicyVersion || st.PolicyReloadErrorAt == nil {
		t.Errorf("/status after a bad file: %+v", st)
	}
	resp, _ = get(t, base+"/api/new", "X-API-Key", "other")
	if got := resp.Header.Get("RateLimit-Policy"); !strings.HasPrefix(got, `"p";q=5;`) {
		t.Errorf("RateLimit-Policy after a bad file = %q, want the q=5 policy still", got)
	}
	_, metrics = get(t, "http://"+s.AdminAddr()+"/metrics")
	for _, want := range []string{`ratelimit_policy_reload_errors_total 1`, `ratelimit_policy_last_reload_success 0`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grep(metrics, "fleetlimit_"))
		}
	}
	if !strings.Contains(logs.String(), `"msg":"policy file rejected; the policies in force stay"`) {
		t.Errorf("the rejection is not logged:\n%s", logs)
	}

	// Fixed: the error clears.
	writeFile(t, path, reloadPolicies(7, true))
	eventually(t, func() string {
		if st := statusOf(t, s); st.PolicyReloadError != "" || st.PolicyVersion == second.PolicyVersion {
			return "after the fix: " + st.PolicyVersion + " " + st.PolicyReloadError
		}
		return ""
	})
}

// TestReloadCalls covers Reload itself: with a file, an unchanged one is
// no change and a bad one an error naming RL_POLICY_FILE; without one, the
// embedded default stays.
func TestReloadCalls(t *testing.T) {
	t.Run("file", func(t *testing.T) {
		path := writePolicyFile(t, reloadPolicies(100, false))
		// A heartbeat of an hour: only Reload reads the file here.
		s, _ := startServer(t, map[string]string{"RL_POLICY_FILE": path, "RL_HEARTBEAT_INTERVAL": "50m", "RL_HEARTBEAT_TTL": "55m"})
		v := s.Policies().Version
		if err := s.Reload(); err != nil || s.Policies().Version != v {
			t.Errorf("unchanged file: %v, version %s -> %s", err, v, s.Policies().Version)
		}
		writeFile(t, path, "{")
		if err := s.Reload(); err == nil || !strings.HasPrefix(err.Error(), "RL_POLICY_FILE: invalid JSON") || s.Policies().Version != v {
			t.Errorf("bad file: %v, version %s -> %s", err, v, s.Policies().Version)
		}
		writeFile(t, path, reloadPolicies(3, false))
		if err := s.Reload(); err != nil || s.Policies().Version == v || s.Policies().Policies[0].Limit != 3 {
			t.Errorf("new file: %v, %+v", err, s.Policies())
		}
		if st := statusOf(t, s); st.PolicyReloads != 3 || st.PolicyReloadError != "" {
			t.Errorf("/status: %+v", st)
		}
	})
	t.Run("embedded default", func(t *testing.T) {
		s, _ := startServer(t, nil)
		v := s.Policies().Version
		if err := s.Reload(); err != nil || v == "" || s.Policies().Version != v {
			t.Errorf("Reload: %v, version %q -> %q", err, v, s.Policies().Version)
		}
		if want := policyVersion(defaultPolicies); v != want {
			t.Errorf("version %s, want the hash of the embedded file %s", v, want)
		}
	})
}
