package httplimit_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// TestRepeatedRequestID sends requests with one X-Request-Id through the
// middleware to a real Redis: only with Config.TrustedRequestIDs, and only from
// a trusted proxy, does a repeat within the resend window go uncounted (a
// proxy's resend); after the window it counts again. Without the option the
// header is ignored and every request counts.
func TestRepeatedRequestID(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	now := time.Now()
	rs := redisstore.New(c, redisstore.Config{ResendWindow: 2 * time.Second, Clock: func() time.Time { return now }})
	tests := []struct {
		name   string
		remote string
		trust  bool
		// the remaining count after each request; the last one comes
		// 3 s after the others, past the window
		want []string
	}{
		{"trusted ids from a trusted proxy", "127.0.0.1:1", true, []string{"9", "9", "9", "8"}},
		{"ids not trusted (the default)", "127.0.0.1:1", false, []string{"9", "8", "7", "6"}},
		{"trusted ids from an untrusted client", "192.0.2.1:1", true, []string{"9", "8", "7", "6"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := ratelimit.Policy{Name: "ids-" + string(rune('a'+i)), Algorithm: ratelimit.SlidingWindowCounter, Limit: 10, Window: time.Hour}
			mw := httplimit.New(rs, httplimit.Config{TrustedProxies: prefixes("127.0.0.1/32"), TrustedRequestIDs: tt.trust})
			for j, want := range tt.want {
				if j == len(tt.want)-1 {
					now = now.Add(3 * time.Second)
				}
				res := serve(mw, newRequest(tt.remote, "X-API-Key", "k", "X-Request-Id", "same-id"), p)
				if res.rec.Code != 200 || !res.next {
					t.Fatalf("request %d: status %d, handler ran %v", j, res.rec.Code, res.next)
				}
				if got := res.rec.Header().Get("X-RateLimit-Remaining"); got != want {
					t.Errorf("request %d: remaining %s, want %s", j, got, want)
				}
			}
		})
	}
}
