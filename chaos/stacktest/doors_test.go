//go:build linux

package stacktest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlimit/fleetlimit/loadtest"
)

// The doors of the native stack with its defaults: the static site behind
// auth_request (the embedded demo policies' checks) and Envoy's rate limit
// service with the example configuration (envoy/ratelimit).
const (
	staticRoute = "/static/"
	filesRoute  = "/static/files/report.txt"
	// clientRoute is the example's descriptor of 100 per 10 s per value.
	clientRoute = loadtest.RLSPrefix + "fleetlimit/client_id"
)

// checkAuthRequest: through the static site's location, nginx asks an app
// and answers with its rate-limit headers (the check's policy, then the
// per-address ceiling); exhausting /static/files/ (its own policy) gets the
// check's 429 problem, and a forged key its 401.
func checkAuthRequest(t *testing.T, s *stack, run string) {
	if want := s.info.NginxURL + staticRoute; s.info.UpstreamURL != want {
		t.Errorf("stack.json upstream_url %q, want %q", s.info.UpstreamURL, want)
	}
	r := s.mustGet(t, staticRoute, withKey("door-"+run))
	if r.status != http.StatusOK || !strings.Contains(string(r.body), "<h1>A static site") {
		t.Fatalf("%s: status %d, body %.100q", staticRoute, r.status, r.body)
	}
	rh, err := parseRateHeaders(r.header)
	if err != nil {
		t.Fatal(err)
	}
	if rh.policy != "static" || rh.r != rh.q-1 || len(rh.others) != 1 || rh.others[0].policy != "per-address" {
		t.Errorf("%s: rate headers %+v, want policy static with q-1 left, then per-address", staticRoute, rh)
	}
	if !slices.Contains(s.appNames(), r.servedBy()) || r.mode() != "redis" {
		t.Errorf("%s: X-Served-By %q, X-RateLimit-Mode %q", staticRoute, r.servedBy(), r.mode())
	}
	if id, err := single(r.header, "X-Request-Id"); err != nil || !requestIDRe.MatchString(id) {
		t.Errorf("%s: X-Request-Id %q (%v)", staticRoute, id, err)
	}

	admitted, limited := exhaust(t, s, filesRoute, withKey("door-files-"+run), 200)
	checkRetryAfter(t, filesRoute, limited)
	if p, err := parseProblem(http.StatusTooManyRequests, limited.header, limited.body); err != nil || p.Policy != "static-files" {
		t.Errorf("%s: the 429's problem %+v (%v), want policy static-files", filesRoute, p, err)
	}
	if rh, err := parseRateHeaders(limited.header); err != nil || rh.policy != "static-files" || rh.r != 0 {
		t.Errorf("%s: the 429's rate headers %+v (%v)", filesRoute, rh, err)
	}
	t.Logf("%s: %d admitted, then 429 with Retry-After %s", filesRoute, admitted, limited.header.Get("Retry-After"))

	r = s.mustGet(t, staticRoute, rawKey("forged.AAAAAAAAAAAAAAAAAAAAAA"))
	if p, err := parseProblem(http.StatusUnauthorized, r.header, r.body); r.status != http.StatusUnauthorized || err != nil {
		t.Errorf("a forged key: status %d, problem %+v (%v)", r.status, p, err)
	}
}

// checkRateLimitService: Envoy's rate limit service through nginx (rls_addr):
// a descriptor is counted by the apps in Redis, with the rate-limit headers,
// the instance, the mode and nginx's request id.
func checkRateLimitService(t *testing.T, s *stack, run string) {
	rls := dialRLS(t, s)
	name := "rls-" + run
	var last *pb.RateLimitResponse
	served := map[string]bool{}
	for i := range 4 {
		resp, md, err := rls.ShouldRateLimit(context.Background(), clientRoute, name)
		if err != nil {
			t.Fatal(err)
		}
		st := resp.GetStatuses()
		if resp.GetOverallCode() != pb.RateLimitResponse_OK || len(st) != 1 || st[0].GetLimitRemaining() != uint32(99-i) ||
			st[0].GetCurrentLimit().GetRequestsPerUnit() != 100 {
			t.Fatalf("call %d: %v, want OK with %d of 100 left", i, resp, 99-i)
		}
		if m, id := md.Get("x-ratelimit-mode"), md.Get("x-request-id"); len(m) != 1 || m[0] != "redis" || len(id) != 1 || !requestIDRe.MatchString(id[0]) {
			t.Errorf("call %d: metadata %v, want mode redis and nginx's request id", i, md)
		}
		served[strings.Join(md.Get("x-served-by"), ",")] = true
		last = resp
	}
	var policy string
	for _, h := range last.GetResponseHeadersToAdd() {
		if h.GetKey() == "RateLimit-Policy" {
			policy = h.GetValue()
		}
	}
	if policy != `"fleetlimit.client_id";q=100;w=10` {
		t.Errorf("RateLimit-Policy %q", policy)
	}
	for by := range served {
		if !slices.Contains(s.appNames(), by) {
			t.Errorf("x-served-by %q is no app", by)
		}
	}
	t.Logf("4 calls through %s answered by %d instances", s.info.RLSAddr, len(served))
}

func dialRLS(t *testing.T, s *stack) *loadtest.RLSClient {
	t.Helper()
	if s.info.RLSAddr == "" {
		t.Fatal("stack.json has no rls_addr")
	}
	rls, err := loadtest.DialRLS(s.info.RLSAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rls.Close() })
	return rls
}

// checkLimiterUnreachable: with no app answering, each location does as
// documented: /static/ serves without a limit (X-RateLimit-Mode: open),
// /static/files/ refuses with a 503 problem, and the rate limit service's
// calls fail (Envoy then applies its own failure_mode_deny). The apps are
// started again afterwards.
func checkLimiterUnreachable(t *testing.T, s *stack, run string) {
	for _, a := range s.appNames() {
		if out, err := s.script("local-service.sh", "stop", a); err != nil {
			t.Fatalf("local-service.sh stop %s: %v\n%s", a, err, out)
		}
	}
	restarted := false
	restart := func() {
		if restarted {
			return
		}
		restarted = true
		for _, a := range s.appNames() {
			if out, err := s.script("local-service.sh", "start", a); err != nil {
				t.Fatalf("local-service.sh start %s: %v\n%s", a, err, out)
			}
		}
		s.readInfo(t) // the apps' new pids
		// nginx takes an app back 2 s after its failure (fail_timeout).
		if _, err := waitFor(10*time.Second, func() error {
			r, err := s.get("/api/gcra", withKey("back-"+run))
			if err == nil && r.status != http.StatusOK {
				err = fmt.Errorf("/api/gcra: status %d", r.status)
			}
			return err
		}); err != nil {
			t.Fatalf("after the apps' restart: %v", err)
		}
	}
	defer restart()

	r, err := s.get(staticRoute, withKey("unreachable-"+run))
	if err != nil || r.status != http.StatusOK || r.mode() != "open" || r.header.Get("RateLimit") != "" {
		t.Errorf("%s without apps: status %d, mode %q, RateLimit %q (%v), want 200 served without a limit (mode open)",
			staticRoute, r.status, r.mode(), r.header.Get("RateLimit"), err)
	}
	r, err = s.get(filesRoute, withKey("unreachable-"+run))
	if err != nil || r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" {
		t.Errorf("%s without apps: status %d, Retry-After %q (%v), want 503 (fails closed)", filesRoute, r.status, r.header.Get("Retry-After"), err)
	} else if p, err := parseProblem(http.StatusServiceUnavailable, r.header, r.body); err != nil || !strings.Contains(p.Detail, "fails closed") {
		t.Errorf("%s without apps: problem %+v (%v)", filesRoute, p, err)
	}
	_, _, err = dialRLS(t, s).ShouldRateLimit(context.Background(), clientRoute, "unreachable-"+run)
	if c := status.Code(err); c != codes.Unavailable && c != codes.Internal && c != codes.Unknown {
		t.Errorf("the rate limit service without apps: %v, want the call to fail", err)
	}
	restart()
	r = s.mustGet(t, staticRoute, withKey("unreachable-"+run))
	if r.status != http.StatusOK || r.mode() != "redis" {
		t.Errorf("%s with the apps back: status %d, mode %q", staticRoute, r.status, r.mode())
	}
}
