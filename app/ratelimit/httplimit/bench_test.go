package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// BenchmarkHandler measures the middleware alone, over a limiter that
// answers at once.
func BenchmarkHandler(b *testing.B) {
	lim := limiterFunc(func(_ context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
		return ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 42, ResetAfter: 3 * time.Second, Mode: ratelimit.ModeRedis}, nil
	})
	mw := httplimit.New(lim, httplimit.Config{ServedBy: "app1", TrustedProxies: prefixes("127.0.0.1/32"), TrustedRequestIDs: true})
	h := mw.Handler(gcra)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	req := httptest.NewRequest(http.MethodGet, "/api/gcra", nil)
	req.RemoteAddr = "127.0.0.1:4000"
	req.Header.Set("X-Real-IP", "203.0.113.9")
	req.Header.Set("X-Request-Id", "0123456789abcdef0123456789abcdef")
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		clear(w.Header())
		h.ServeHTTP(w, req)
	}
}
