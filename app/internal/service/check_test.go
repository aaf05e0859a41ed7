package service

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// TestCheckThatWritesNothingIsNoAllow: a middleware path that writes
// nothing (here the one of a request whose context ended before the
// decision) must not become an allow: the check answers 500, what
// auth_request's location treats as "limiter unreachable", never 204.
func TestCheckThatWritesNothingIsNoAllow(t *testing.T) {
	s := &Server{cfg: Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var decided atomic.Bool
	limiter := ratelimit.LimiterFunc(func(ctx context.Context, _ ratelimit.Request) (ratelimit.Decision, error) {
		<-ctx.Done()
		decided.Store(true)
		return ratelimit.Decision{}, ctx.Err()
	})
	set := PolicySet{Checks: []Route{{Pattern: "/static/*", Policies: []ratelimit.Policy{
		{Name: "static", Algorithm: ratelimit.SlidingWindowCounter, Limit: 2, Window: time.Minute}}}}}
	h := s.checkHandler(set, httplimit.New(limiter))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, CheckPath, nil) // RemoteAddr 192.0.2.1
	r.Header.Set(HeaderOriginalURI, "/static/index.html")
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
