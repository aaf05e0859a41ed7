package authrequest_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/internal/authrequest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// TestCheckThatWritesNothingIsNoAllow: a middleware path that writes
// nothing (here the one of a request whose context ended before the
// decision) must not become an allow: the check answers 500, what
// auth_request's location treats as "limiter unreachable", never 204.
func TestCheckThatWritesNothingIsNoAllow(t *testing.T) {
	var decided atomic.Bool
	limiter := limiterFunc(func(ctx context.Context, _ ratelimit.Request) (ratelimit.Decision, error) {
		<-ctx.Done()
		decided.Store(true)
		return ratelimit.Decision{}, ctx.Err()
	})
	checks := []authrequest.Check{{Pattern: "/static/*", Policies: []ratelimit.Policy{
		{Name: "static", Algorithm: ratelimit.SlidingWindowCounter, Limit: 2, Window: time.Minute}}}}
	var told atomic.Int64
	h := authrequest.Handler(checks, httplimit.New(limiter, httplimit.Config{}), []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		func(*http.Request, string) { told.Add(1) })

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, authrequest.Path, nil) // RemoteAddr 192.0.2.1
	r.Header.Set(authrequest.HeaderOriginalURI, "/static/index.html")
	r.Header.Set("X-Real-IP", "198.51.100.7")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if !decided.Load() {
		t.Fatal("the limiter was not asked")
	}
	if w.Code != http.StatusInternalServerError {
		t.Fatalf("status %d for a check that wrote nothing, want 500 (never an allow)", w.Code)
	}
}

// TestUntrustedPeerGetsNotFound: the check endpoint answers only the
// trusted proxies; anyone else gets 404 and the limiter is not asked.
func TestUntrustedPeerGetsNotFound(t *testing.T) {
	var asked atomic.Bool
	limiter := limiterFunc(func(context.Context, ratelimit.Request) (ratelimit.Decision, error) {
		asked.Store(true)
		return ratelimit.Decision{Allowed: true}, nil
	})
	checks := []authrequest.Check{{Pattern: "/*", Policies: []ratelimit.Policy{
		{Name: "all", Algorithm: ratelimit.SlidingWindowCounter, Limit: 2, Window: time.Minute}}}}
	h := authrequest.Handler(checks, httplimit.New(limiter, httplimit.Config{}), []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, nil)
	r := httptest.NewRequest(http.MethodGet, authrequest.Path, nil) // RemoteAddr 192.0.2.1
	r.Header.Set(authrequest.HeaderOriginalURI, "/index.html")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusNotFound || asked.Load() {
		t.Fatalf("status %d (limiter asked: %v), want 404 without a decision", w.Code, asked.Load())
	}
}

// limiterFunc adapts a function to ratelimit.Limiter.
type limiterFunc func(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error)

func (f limiterFunc) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	return f(ctx, req)
}
