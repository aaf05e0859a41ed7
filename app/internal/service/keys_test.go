package service

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/redistest"
)

// keysPolicies are the policies of the /admin/keys tests: windows of an
// hour, so that nothing refills noticeably while a test runs.
const keysPolicies = `{
  "policies": [
    {"name": "a", "algorithm": "gcra", "limit": 100, "window": "1h"},
    {"name": "b", "algorithm": "token_bucket", "limit": 100, "window": "1h"},
    {"name": "c", "algorithm": "sliding_window_log", "limit": 100, "window": "1h"},
    {"name": "l", "algorithm": "gcra", "limit": 1000, "window": "1h", "lease": "10s"},
    {"name": "addr", "algorithm": "sliding_window_counter", "limit": 1000, "window": "1h", "per": "address"}
  ],
  "routes": [
    {"pattern": "/api/a", "policies": ["a", "addr"]},
    {"pattern": "/api/b", "policies": ["b", "addr"]},
    {"pattern": "/api/l", "policies": ["l", "addr"]},
    {"pattern": "/api/*", "policies": ["c", "addr"]}
  ]
}`

const keysToken = "keys-token-0123456789abcdef0123456789"

func keysEnv(t *testing.T, env map[string]string) map[string]string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policies.json")
	if err := os.WriteFile(path, []byte(keysPolicies), 0o600); err != nil {
		t.Fatal(err)
	}
	env["RL_POLICY_FILE"] = path
	env["RL_ADMIN_TOKEN"] = keysToken
	return env
}

// getKeys asks GET /admin/keys with query and decodes a 200 answer.
func getKeys(t *testing.T, s *Server, query string) keysResponse {
	t.Helper()
	resp, body := get(t, "http://"+s.AdminAddr()+"/admin/keys?"+query, "Authorization", "Bearer "+keysToken)
	var out keysResponse
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &out) != nil {
		t.Fatalf("GET /admin/keys?%s: %d %s", query, resp.StatusCode, body)
	}
	return out
}

// byPolicy indexes a /admin/keys answer by policy name.
func byPolicy(out keysResponse) map[string]keyPolicy {
	m := map[string]keyPolicy{}
	for _, p := range out.Policies {
		m[p.Policy] = p
	}
	return m
}

// redisRemaining returns what the answer says Redis has left of policy.
func redisRemaining(t *testing.T, out keysResponse, policy string) int64 {
	t.Helper()
	p, ok := byPolicy(out)[policy]
	if !ok || p.Redis == nil || p.Redis.Error != "" || p.Redis.Remaining == nil || p.Redis.ResetSeconds == nil {
		t.Fatalf("policy %s: %+v, want Redis's remaining and reset", policy, p.Redis)
	}
	return *p.Redis.Remaining
}

// TestAdminKeys (a real redis-server): GET /admin/keys shows what a key
// spent under the policies of the routes it used and the full quota
// elsewhere, counts nothing however often it is asked, shows a lease
// held; with Redis killed it says Redis could not answer and shows the
// local share and the journaled grants; a bad query is a 400 problem, a
// request without the admin token a 401.
func TestAdminKeys(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	s, _ := startServer(t, keysEnv(t, map[string]string{"RL_REDIS_URL": "redis://" + srv.Addr() + "/0", "RL_DEBUG_HEADERS": "true"}))
	api := "http://" + s.PublicAddr() + "/api/"
	for _, route := range []string{"a", "b"} {
		for range 3 {
			if resp, body := get(t, api+route, "X-API-Key", "abc"); resp.StatusCode != 200 {
				t.Fatalf("/api/%s: %d %s", route, resp.StatusCode, body)
			}
		}
	}

	out := getKeys(t, s, "key=k:abc")
	if out.Instance != "test-1" || out.Key != "k:abc" || out.Mode != "redis" || out.Breaker != "closed" {
		t.Fatalf("answer: %+v", out)
	}
	got := byPolicy(out)
	if _, ok := got["addr"]; ok || len(got) != 4 {
		t.Fatalf("policies %v: want a, b, c and l (an API key is not counted per address)", got)
	}
	want := map[string]int64{"a": 97, "b": 97, "c": 100, "l": 1000}
	for name, n := range want {
		if r := redisRemaining(t, out, name); r != n {
			t.Errorf("policy %s: %d remaining in Redis, want %d", name, r, n)
		}
		if p := got[name]; p.Local == nil || p.Local.Share != nil || p.Local.Lease != nil || p.Local.RefusedUntil != nil || p.Local.Journaled != 0 {
			t.Errorf("policy %s: local %+v, want nothing held here", name, p.Local)
		}
	}
	if p := got["a"]; p.Algorithm != "gcra" || p.Limit != 100 || p.Capacity != 100 || p.WindowSeconds != 3600 {
		t.Errorf("policy a described as %+v", p)
	}
	// The address is counted per address too: six requests.
	if r := redisRemaining(t, getKeys(t, s, "key=ip:127.0.0.1&policy=addr"), "addr"); r != 994 {
		t.Errorf("per address: %d remaining, want 994", r)
	}

	// Asked again and again, it counts nothing.
	for range 20 {
		out = getKeys(t, s, "key=k:abc")
	}
	for name, n := range want {
		if r := redisRemaining(t, out, name); r != n {
			t.Errorf("after 20 reads, policy %s: %d remaining, want %d still", name, r, n)
		}
	}
	if resp, body := get(t, api+"a", "X-API-Key", "abc"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "96" {
		t.Fatalf("a request after the reads: %d, remaining %s, want 96: %s", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), body)
	}
	if out = getKeys(t, s, "key=k:abc&policy=a"); len(out.Policies) != 1 || redisRemaining(t, out, "a") != 96 {
		t.Fatalf("policy=a after a fourth request: %+v, want 96 remaining under a only", out.Policies)
	}

	// A hot key of a lease policy holds a lease here.
	for range 2 * 8 {
		if resp, body := get(t, api+"l", "X-API-Key", "hot"); resp.StatusCode != 200 {
			t.Fatalf("/api/l: %d %s", resp.StatusCode, body)
		}
	}
	if l := byPolicy(getKeys(t, s, "key=k:hot&policy=l"))["l"].Local; l == nil || l.Lease == nil || l.Lease.Units <= 0 || !l.Lease.Until.After(time.Now()) {
		t.Errorf("a hot key of a lease policy: local %+v, want a lease", l)
	}

	// Bad queries; no token.
	for _, query := range []string{"", "key=abc", "key=k:not%20an%20id", "key=ip:999.1.1.1", "key=k:abc&policy=nope", "key=k:abc&n=3", "key=k:abc&key=k:def"} {
		resp, body := get(t, "http://"+s.AdminAddr()+"/admin/keys?"+query, "Authorization", "Bearer "+keysToken)
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(body), "#invalid-request") {
			t.Errorf("?%s: %d %s, want a 400 problem", query, resp.StatusCode, body)
		}
	}
	for _, h := range [][]string{nil, {"Authorization", "Bearer wrong-0123456789abcdef0123456789abcd"}} {
		if resp, _ := get(t, "http://"+s.AdminAddr()+"/admin/keys?key=k:abc", h...); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET /admin/keys with %v: %d, want 401", h, resp.StatusCode)
		}
	}

	// Redis killed: local grants.
	srv.Kill()
	for range 5 {
		if resp, body := get(t, api+"a", "X-API-Key", "abc"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Mode") != "local" {
			t.Fatalf("/api/a with Redis out: %d, mode %s: %s", resp.StatusCode, resp.Header.Get("X-RateLimit-Mode"), body)
		}
	}
	out = getKeys(t, s, "key=k:abc&policy=a")
	p := byPolicy(out)["a"]
	if p.Redis == nil || p.Redis.Error == "" || p.Redis.Remaining != nil {
		t.Errorf("Redis out: redis %+v, want an error", p.Redis)
	}
	if p.Local == nil || p.Local.Share == nil || p.Local.Share.Remaining <= 0 || p.Local.Journaled != 5 {
		t.Errorf("Redis out: local %+v, want a share and 5 journaled", p.Local)
	}
	for range 20 {
		again := byPolicy(getKeys(t, s, "key=k:abc&policy=a"))["a"].Local
		if again == nil || again.Share == nil || *again.Share != *p.Local.Share || again.Journaled != 5 {
			t.Fatalf("Redis out, read again: %+v, want %+v", again, p.Local)
		}
	}
	if resp, _ := get(t, api+"a", "X-API-Key", "abc"); resp.Header.Get("X-RateLimit-Remaining") != strconv.FormatInt(p.Local.Share.Remaining-1, 10) {
		t.Errorf("the next local grant: remaining %s, want %d", resp.Header.Get("X-RateLimit-Remaining"), p.Local.Share.Remaining-1)
	}
}

// TestAdminKeysMemory: in memory mode the memory store's state is shown,
// and nothing of Redis.
func TestAdminKeysMemory(t *testing.T) {
	s, _ := startServer(t, keysEnv(t, map[string]string{}))
	for range 3 {
		get(t, "http://"+s.PublicAddr()+"/api/a", "X-API-Key", "abc")
	}
	for range 3 {
		getKeys(t, s, "key=k:abc&policy=a")
	}
	out := getKeys(t, s, "key=k:abc&policy=a")
	p := byPolicy(out)["a"]
	if out.Mode != "memory" || p.Redis != nil || p.Local != nil || p.Memory == nil || p.Memory.Remaining == nil || *p.Memory.Remaining != 97 {
		t.Fatalf("memory mode: %+v %+v, want 97 remaining in memory", out, p.Memory)
	}
}
