package service

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/fleetlimit/fleetlimit/app/internal/authrequest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// doorPolicies has a check for /static/ (2 a minute per key, under a
// per-address ceiling of 5) and one for /open/ without limits.
const doorPolicies = `{
  "policies": [
    {"name": "api", "algorithm": "gcra", "limit": 100, "window": "10s"},
    {"name": "static", "algorithm": "sliding_window_counter", "limit": 2, "window": "1m"},
    {"name": "per-address", "algorithm": "sliding_window_counter", "limit": 5, "window": "1m", "per": "address"}
  ],
  "routes": [{"pattern": "/api/*", "policies": ["api", "per-address"]}],
  "checks": [
    {"pattern": "/static/*", "policies": ["static", "per-address"]},
    {"pattern": "/open/*", "policies": []}
  ]
}`

func writeTempFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// check asks the check endpoint about a GET of uri, as nginx does.
func check(t *testing.T, s *Server, uri string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	return get(t, "http://"+s.PublicAddr()+authrequest.Path, append([]string{authrequest.HeaderOriginalURI, uri, authrequest.HeaderOriginalMethod, "GET",
		"X-Real-IP", "198.51.100.7"}, headers...)...)
}

// TestCheckEndpoint: the check endpoint applies a check's policies to the
// original URI with the routes' middleware, and answers in auth_request's
// terms: 204 admitted, 403 for a 429, 401 for a 400 or 401, each refusal
// with the status and problem the client is to get; 500 for a URI no
// check matches (the proxy's "limiter unreachable").
func TestCheckEndpoint(t *testing.T) {
	s, _ := startServer(t, map[string]string{"RL_POLICY_FILE": writeTempFile(t, "p.json", doorPolicies), "RL_DEBUG_HEADERS": "true"})
	for i := range 2 {
		resp, _ := check(t, s, "/static/a/../index.html?x=1", "X-API-Key", "alice")
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("check %d: status %d, want 204", i, resp.StatusCode)
		}
		if got, want := resp.Header.Get("RateLimit-Policy"), `"static";q=2;w=60, "per-address";q=5;w=60`; got != want {
			t.Fatalf("RateLimit-Policy %q, want %q", got, want)
		}
		if resp.Header.Get("X-Served-By") != "test-1" || resp.Header.Get("X-RateLimit-Mode") != "memory" {
			t.Fatalf("debug headers %v", resp.Header)
		}
	}
	resp, _ := check(t, s, "/static/other.html", "X-API-Key", "alice")
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get(authrequest.HeaderCheckStatus) != "429" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third check: status %d %v, want 403 with status 429 and Retry-After", resp.StatusCode, resp.Header)
	}
	var p httplimit.Problem
	if err := json.Unmarshal([]byte(resp.Header.Get(authrequest.HeaderCheckProblem)), &p); err != nil || p.Status != 429 ||
		p.Policy != "static" || p.Instance != "/static/other.html" || strconv.FormatInt(p.RetryAfter, 10) != resp.Header.Get("Retry-After") {
		t.Fatalf("problem %q (%v)", resp.Header.Get(authrequest.HeaderCheckProblem), err)
	}
	// Another key from the same address: its own quota, under the
	// per-address ceiling of 5 (3 used).
	for i := range 2 {
		if resp, _ := check(t, s, "/static/", "X-API-Key", "bob"); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("bob's check %d: status %d", i, resp.StatusCode)
		}
	}
	resp, _ = check(t, s, "/static/", "X-API-Key", "carol")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(resp.Header.Get(authrequest.HeaderCheckProblem), `"policy":"per-address"`) {
		t.Fatalf("over the address's ceiling: status %d, problem %q", resp.StatusCode, resp.Header.Get(authrequest.HeaderCheckProblem))
	}
	// A forged key, and a malformed one, from another address.
	resp, _ = check(t, s, "/static/", "X-API-Key", "forged.AAAAAAAAAAAAAAAAAAAAAA", "X-Real-IP", "198.51.100.8")
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get(authrequest.HeaderCheckStatus) != "401" {
		t.Fatalf("forged key: status %d %v, want 401 with status 401", resp.StatusCode, resp.Header)
	}
	resp, _ = check(t, s, "/static/", "X-API-Key", strings.Repeat("k", 300), "X-Real-IP", "198.51.100.8")
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get(authrequest.HeaderCheckStatus) != "400" {
		t.Fatalf("malformed key: status %d %v, want 401 with status 400", resp.StatusCode, resp.Header)
	}
	if resp, _ := check(t, s, "/open/x", "X-API-Key", "alice"); resp.StatusCode != http.StatusNoContent || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("a check without limits: status %d %v", resp.StatusCode, resp.Header)
	}
	if resp, _ := check(t, s, "/elsewhere", "X-API-Key", "alice"); resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("a URI no check matches: status %d, want 500", resp.StatusCode)
	}
	if resp, _ := get(t, "http://"+s.PublicAddr()+authrequest.Path, "X-API-Key", "alice"); resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("no original URI: status %d, want 500", resp.StatusCode)
	}
}

// TestCheckOnlyForTrustedProxies: a peer that is not a trusted proxy finds
// no check endpoint.
func TestCheckOnlyForTrustedProxies(t *testing.T) {
	s, _ := startServer(t, map[string]string{"RL_POLICY_FILE": writeTempFile(t, "p.json", doorPolicies), "RL_TRUSTED_PROXIES": "192.0.2.0/24"})
	if resp, _ := check(t, s, "/static/", "X-API-Key", "alice"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d from an untrusted peer, want 404", resp.StatusCode)
	}
}

// TestRateLimitService: RL_GRPC_ADDR serves Envoy's rate limit service
// with RL_RLS_CONFIG_DIR, decided by the service's limiter (mode memory
// here), beside the health service.
func TestRateLimitService(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ := startServer(t, map[string]string{"RL_GRPC_ADDR": "127.0.0.1:0", "RL_RLS_CONFIG_DIR": dir,
		"RL_RLS_RESPONSE_HEADERS": "true", "RL_DEBUG_HEADERS": "true"})
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	if h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v %v", h, err)
	}
	c := pb.NewRateLimitServiceClient(conn)
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	var codes []pb.RateLimitResponse_Code
	var md metadata.MD
	for range 3 {
		r, err := c.ShouldRateLimit(ctx, req, grpc.Header(&md))
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, r.OverallCode)
		if len(r.ResponseHeadersToAdd) == 0 {
			t.Fatal("no response headers with RL_RLS_RESPONSE_HEADERS=true")
		}
	}
	if codes[0] != pb.RateLimitResponse_OK || codes[1] != pb.RateLimitResponse_OK || codes[2] != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("codes %v, want OK, OK, OVER_LIMIT", codes)
	}
	if got := md.Get("x-ratelimit-mode"); len(got) != 1 || got[0] != "memory" {
		t.Fatalf("mode %v, want memory", got)
	}
}

func TestRateLimitServiceConfigErrors(t *testing.T) {
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "x.yaml"), []byte("domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"RL_GRPC_ADDR": "127.0.0.1:0"}, "RL_RLS_CONFIG_DIR: needed with RL_GRPC_ADDR"},
		{map[string]string{"RL_GRPC_ADDR": "127.0.0.1:0", "RL_RLS_CONFIG_DIR": bad}, "RL_RLS_CONFIG_DIR: x.yaml:4: invalid rate limit unit 'fortnight'"},
		{map[string]string{"RL_GRPC_ADDR": ":9090", "RL_RLS_CONFIG_DIR": bad}, "RL_GRPC_ADDR: must differ"},
	} {
		_, err := LoadConfig(envOf(c.env))
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.env, err, c.want)
		}
	}
}

// TestChaosPolicies: the chaos suite's policy file loads, has the doors'
// checks, and keeps to the contract: a 10 s window and a quota (token
// bucket and GCRA: a capacity) of at least 100 for every policy of a key.
func TestChaosPolicies(t *testing.T) {
	set, err := LoadPolicies("../../../chaos/policies.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Checks) == 0 || set.Checks[0].Pattern != "/static/*" {
		t.Fatalf("checks %+v, want the static site's", set.Checks)
	}
	for _, p := range set.Policies {
		if p.Window != 10*time.Second || p.Capacity() < 100 {
			t.Errorf("policy %s: window %v, capacity %d; the contract wants 10 s and at least 100", p.Name, p.Window, p.Capacity())
		}
	}
}
