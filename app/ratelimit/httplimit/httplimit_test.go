package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/mocks"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
)

var (
	gcra  = ratelimit.Policy{Name: "gcra", Algorithm: ratelimit.GCRA, Limit: 100, Window: 10 * time.Second}
	perIP = ratelimit.Policy{Name: "per-ip", Algorithm: ratelimit.SlidingWindowCounter, Limit: 1000, Window: time.Minute}
	burst = ratelimit.Policy{Name: "burst", Algorithm: ratelimit.TokenBucket, Limit: 10, Window: time.Second, Burst: 20}
)

// allowAll is a scripted limiter that admits everything with 7 remaining.
func allowAll() *mocks.Limiter {
	return &mocks.Limiter{DecideFunc: func(_ context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
		return ratelimit.Decision{Allowed: true, Limit: req.Policy.Capacity(), Remaining: 7,
			ResetAfter: time.Second, Mode: ratelimit.ModeMemory}, nil
	}}
}

// scripted returns a limiter answering each policy by name.
func scripted(decisions map[string]ratelimit.Decision) *mocks.Limiter {
	return &mocks.Limiter{DecideFunc: func(_ context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
		d, ok := decisions[req.Policy.Name]
		if !ok {
			return ratelimit.Decision{}, fmt.Errorf("no script for %q", req.Policy.Name)
		}
		return d, nil
	}}
}

type result struct {
	rec  *httptest.ResponseRecorder
	next bool // the wrapped handler ran
}

func serve(mw *httplimit.Middleware, req *http.Request, policies ...ratelimit.Policy) result {
	var res result
	h := mw.Handler(policies...)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		res.next = true
		_, _ = w.Write([]byte("ok"))
	}))
	res.rec = httptest.NewRecorder()
	h.ServeHTTP(res.rec, req)
	return res
}

func newRequest(remote string, headers ...string) *http.Request {
	req := httptest.NewRequest(http.MethodGet, "/api/thing", nil)
	req.RemoteAddr = remote
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	return req
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func decodeProblem(t *testing.T, rec *httptest.ResponseRecorder) httplimit.Problem {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json", ct)
	}
	var p httplimit.Problem
	dec := json.NewDecoder(rec.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("problem body: %v", err)
	}
	if p.Status != rec.Code {
		t.Errorf("problem status = %d, response %d", p.Status, rec.Code)
	}
	if p.Type == "" || p.Title == "" || p.Detail == "" {
		t.Errorf("problem lacks type, title or detail: %+v", p)
	}
	return p
}

func TestIdentity(t *testing.T) {
	trusted := prefixes("10.0.0.0/8", "127.0.0.1/32", "::1/128")
	tests := []struct {
		name    string
		remote  string
		headers []string
		want    string
	}{
		{"peer v4", "192.0.2.1:1234", nil, "ip:192.0.2.1"},
		{"peer without port", "192.0.2.1", nil, "ip:192.0.2.1"},
		{"spoofed XFF from untrusted peer", "192.0.2.1:1234",
			[]string{"X-Forwarded-For", "198.51.100.1"}, "ip:192.0.2.1"},
		{"spoofed X-Real-IP from untrusted peer", "192.0.2.1:1234",
			[]string{"X-Real-IP", "198.51.100.1"}, "ip:192.0.2.1"},
		{"X-Real-IP from trusted proxy", "127.0.0.1:5000",
			[]string{"X-Real-IP", "203.0.113.9"}, "ip:203.0.113.9"},
		{"XFF appended by trusted proxy, client spoof ignored", "127.0.0.1:5000",
			[]string{"X-Forwarded-For", "198.51.100.1, 203.0.113.9"}, "ip:203.0.113.9"},
		{"trusted chain", "10.0.0.2:80",
			[]string{"X-Forwarded-For", "6.6.6.6, 198.51.100.7, 10.0.0.5, 10.1.2.3"}, "ip:198.51.100.7"},
		{"XFF over several header lines", "10.0.0.2:80",
			[]string{"X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "198.51.100.7,10.0.0.5"}, "ip:198.51.100.7"},
		{"trusted X-Real-IP falls through to XFF", "10.0.0.2:80",
			[]string{"X-Real-IP", "10.0.0.5", "X-Forwarded-For", "198.51.100.7, 10.0.0.5"}, "ip:198.51.100.7"},
		{"every hop trusted: the furthest", "10.0.0.2:80",
			[]string{"X-Forwarded-For", "10.9.9.9, 10.0.0.5"}, "ip:10.9.9.9"},
		{"garbage hop stops the walk", "10.0.0.2:80",
			[]string{"X-Forwarded-For", "198.51.100.7, nonsense, 10.0.0.5"}, "ip:10.0.0.5"},
		{"hop with port", "10.0.0.2:80",
			[]string{"X-Forwarded-For", "198.51.100.7:4711"}, "ip:198.51.100.7"},
		{"trusted peer without forwarding headers", "127.0.0.1:5000", nil, "ip:127.0.0.1"},
		{"IPv6 grouped by /64", "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", nil, "ip:2001:db8:1:2::/64"},
		{"IPv6 neighbour in the same /64", "[2001:db8:1:2::1]:443", nil, "ip:2001:db8:1:2::/64"},
		{"IPv6 through trusted proxy", "[::1]:80",
			[]string{"X-Forwarded-For", "2001:db8:9:8:7:6:5:4"}, "ip:2001:db8:9:8::/64"},
		{"IPv4-mapped IPv6 peer", "[::ffff:192.0.2.9]:80", nil, "ip:192.0.2.9"},
		{"zone dropped", "[fe80::1%eth0]:80", nil, "ip:fe80::/64"},
		{"unparseable peer", "@", nil, "ip:unknown"},
		{"API key", "192.0.2.1:1234", []string{"X-API-Key", "abc"}, "k:abc"},
		{"API key shaped like an IP does not collide", "192.0.2.1:1234",
			[]string{"X-API-Key", "192.0.2.1"}, "k:192.0.2.1"},
		{"hash tag passed through unchanged", "192.0.2.1:1234",
			[]string{"X-API-Key", "{slot}x"}, "k:{slot}x"},
		{"API key wins over forwarded IP", "127.0.0.1:1",
			[]string{"X-API-Key", "abc", "X-Real-IP", "203.0.113.9"}, "k:abc"},
		{"longest API key", "192.0.2.1:1", []string{"X-API-Key", strings.Repeat("a", 254)}, "k:" + strings.Repeat("a", 254)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := allowAll()
			mw := httplimit.New(lim, httplimit.Config{TrustedProxies: trusted})
			res := serve(mw, newRequest(tt.remote, tt.headers...), gcra)
			if res.rec.Code != http.StatusOK {
				t.Fatalf("status = %d, body %s", res.rec.Code, res.rec.Body)
			}
			calls := lim.DecideCalls()
			if len(calls) != 1 {
				t.Fatalf("Decide called %d times", len(calls))
			}
			if got := calls[0].Req.Key; got != tt.want {
				t.Errorf("key = %q, want %q", got, tt.want)
			}
			if tt.headers == nil || tt.headers[0] != "X-API-Key" {
				req := newRequest(tt.remote, tt.headers...)
				if got := httplimit.IPKey(httplimit.ClientIP(req, trusted)); got != tt.want {
					t.Errorf("IPKey(ClientIP) = %q, want %q", got, tt.want)
				}
			}
		})
	}
}

func TestNoTrustedProxiesByDefault(t *testing.T) {
	lim := allowAll()
	res := serve(httplimit.New(lim, httplimit.Config{}), newRequest("127.0.0.1:1", "X-Real-IP", "203.0.113.9",
		"X-Forwarded-For", "203.0.113.9", "X-Request-Id", "from-client"), gcra)
	if got := lim.DecideCalls()[0].Req.Key; got != "ip:127.0.0.1" {
		t.Errorf("key = %q, want the peer", got)
	}
	if got := res.rec.Header().Get("X-Request-Id"); got == "from-client" {
		t.Errorf("request id taken from an untrusted peer")
	}
}

func TestBadKeys(t *testing.T) {
	tests := []struct {
		name    string
		headers []string
		cfg     httplimit.Config
		limiter ratelimit.Limiter
		want    int
	}{
		{"over-long API key", []string{"X-API-Key", strings.Repeat("a", 255)}, httplimit.Config{}, nil, 400},
		{"control character", []string{"X-API-Key", "a\tb"}, httplimit.Config{}, nil, 400},
		{"empty API key", []string{"X-API-Key", ""}, httplimit.Config{}, nil, 400},
		{"two API keys", []string{"X-API-Key", "a", "X-API-Key", "b"}, httplimit.Config{}, nil, 400},
		{"limiter says invalid", nil, httplimit.Config{}, limiterFunc(func(context.Context, ratelimit.Request) (ratelimit.Decision, error) {
			return ratelimit.Decision{}, fmt.Errorf("store: %w: cost too high", ratelimit.ErrInvalidRequest)
		}), 400},
		{"key func error", nil, httplimit.Config{KeyFunc: func(*http.Request, ratelimit.Policy) (string, error) {
			return "", errors.New("no tenant header")
		}}, nil, 400},
		{"key func returns unusable key", nil, httplimit.Config{KeyFunc: func(*http.Request, ratelimit.Policy) (string, error) {
			return "tenant\x00", nil
		}}, nil, 400},
		{"cost above capacity", nil, httplimit.Config{Cost: func(*http.Request) int64 { return 101 }},
			memstore.New(memstore.Config{}), 400},
		{"key check refuses", []string{"X-API-Key", "stolen"}, httplimit.Config{APIKeys: func(_ context.Context, key string) (string, error) { return "", errors.New("revoked") }},
			nil, 401},
		{"key func says invalid API key", nil, httplimit.Config{KeyFunc: func(*http.Request, ratelimit.Policy) (string, error) {
			return "", fmt.Errorf("tenant: %w", httplimit.ErrInvalidAPIKey)
		}}, nil, 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spy := allowAll()
			var lim ratelimit.Limiter = spy
			if tt.limiter != nil {
				lim = tt.limiter
			}
			res := serve(httplimit.New(lim, tt.cfg), newRequest("192.0.2.1:1", tt.headers...), gcra)
			if res.rec.Code != tt.want {
				t.Fatalf("status = %d, want %d", res.rec.Code, tt.want)
			}
			if res.next {
				t.Error("the wrapped handler ran")
			}
			p := decodeProblem(t, res.rec)
			if p.RetryAfter != 0 {
				t.Errorf("retry_after = %d on a %d", p.RetryAfter, tt.want)
			}
			if strings.Contains(p.Detail, "stolen") || strings.Contains(p.Detail, "aaaa") {
				t.Errorf("detail echoes the key: %q", p.Detail)
			}
			if tt.limiter == nil && tt.want == 401 || strings.Contains(tt.name, "API key") && tt.want == 400 {
				if n := len(spy.DecideCalls()); n != 0 {
					t.Errorf("limiter called %d times for a refused key", n)
				}
			}
		})
	}
}

func TestValidatorAcceptsKey(t *testing.T) {
	var seen string
	lim := allowAll()
	mw := httplimit.New(lim, httplimit.Config{APIKeys: func(_ context.Context, key string) (string, error) {
		seen = key
		return key, nil
	}})
	res := serve(mw, newRequest("192.0.2.1:1", "X-API-Key", "good"), gcra)
	if res.rec.Code != 200 || seen != "good" || lim.DecideCalls()[0].Req.Key != "k:good" {
		t.Errorf("status %d, check saw %q, key %q", res.rec.Code, seen, lim.DecideCalls()[0].Req.Key)
	}
}

func TestHeaders(t *testing.T) {
	tests := []struct {
		name   string
		policy ratelimit.Policy
		d      ratelimit.Decision
		debug  bool
		status int
		want   map[string]string // "" means absent
	}{
		{"admitted", gcra, ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 42, ResetAfter: 2100 * time.Millisecond, Mode: ratelimit.ModeRedis},
			false, 200, map[string]string{
				"RateLimit-Policy":      `"gcra";q=100;w=10`,
				"RateLimit":             `"gcra";r=42;t=3`,
				"X-RateLimit-Limit":     "100",
				"X-RateLimit-Remaining": "42",
				"X-RateLimit-Reset":     "3",
				"Retry-After":           "",
				"X-Served-By":           "",
				"X-RateLimit-Mode":      "",
			}},
		{"admitted with debug headers", gcra, ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 0, ResetAfter: 10 * time.Second, Mode: ratelimit.ModeLocal},
			true, 200, map[string]string{
				"RateLimit":        `"gcra";r=0;t=10`,
				"X-Served-By":      "app3",
				"X-RateLimit-Mode": "local",
			}},
		{"refused", gcra, ratelimit.Decision{Allowed: false, Limit: 100, Remaining: 0, ResetAfter: 9500 * time.Millisecond, RetryAfter: 1500 * time.Millisecond, Mode: ratelimit.ModeRedis},
			true, 429, map[string]string{
				"RateLimit-Policy":      `"gcra";q=100;w=10`,
				"RateLimit":             `"gcra";r=0;t=10`,
				"X-RateLimit-Limit":     "100",
				"X-RateLimit-Remaining": "0",
				"X-RateLimit-Reset":     "10",
				"Retry-After":           "2",
				"X-RateLimit-Mode":      "redis",
			}},
		{"refused with no wait still says 1 s", gcra, ratelimit.Decision{Allowed: false, Limit: 100, Mode: ratelimit.ModeClosed},
			true, 429, map[string]string{"Retry-After": "1", "RateLimit": `"gcra";r=0;t=0`, "X-RateLimit-Mode": "closed"}},
		{"burst capacity as quota", burst, ratelimit.Decision{Allowed: true, Limit: 20, Remaining: 19, ResetAfter: 100 * time.Millisecond},
			false, 200, map[string]string{
				"RateLimit-Policy":  `"burst";q=20;w=1`,
				"RateLimit":         `"burst";r=19;t=1`,
				"X-RateLimit-Limit": "20",
			}},
		{"sub-second window rounds up", ratelimit.Policy{Name: "fast", Algorithm: ratelimit.GCRA, Limit: 5, Window: 200 * time.Millisecond},
			ratelimit.Decision{Allowed: true, Limit: 5, Remaining: 4},
			false, 200, map[string]string{"RateLimit-Policy": `"fast";q=5;w=1`}},
		{"negative remaining clamps", gcra, ratelimit.Decision{Allowed: true, Remaining: -3},
			false, 200, map[string]string{"X-RateLimit-Remaining": "0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := httplimit.Config{TrustedProxies: prefixes("127.0.0.1/32"), TrustedRequestIDs: true}
			if tt.debug {
				cfg.ServedBy = "app3"
			}
			mw := httplimit.New(scripted(map[string]ratelimit.Decision{tt.policy.Name: tt.d}), cfg)
			res := serve(mw, newRequest("127.0.0.1:1", "X-Request-Id", "nginx-id-1"), tt.policy)
			if res.rec.Code != tt.status {
				t.Fatalf("status = %d, want %d", res.rec.Code, tt.status)
			}
			if res.next != (tt.status == 200) {
				t.Errorf("wrapped handler ran: %v", res.next)
			}
			for k, want := range tt.want {
				if got := res.rec.Header().Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
			if got := res.rec.Header().Get("X-Request-Id"); got != "nginx-id-1" {
				t.Errorf("X-Request-Id = %q, want the trusted proxy's", got)
			}
			if tt.status != 429 {
				return
			}
			p := decodeProblem(t, res.rec)
			if p.Status != 429 || p.Title != "Too Many Requests" || p.Type != "https://github.com/fleetlimit/fleetlimit/blob/main/docs/problems.md#rate-limited" ||
				p.Policy != tt.policy.Name || p.RequestID != "nginx-id-1" || p.Instance != "/api/thing" {
				t.Errorf("problem = %+v", p)
			}
			if got := fmt.Sprint(p.RetryAfter); got != res.rec.Header().Get("Retry-After") {
				t.Errorf("retry_after = %s, Retry-After %s", got, res.rec.Header().Get("Retry-After"))
			}
		})
	}
}

func TestRequestID(t *testing.T) {
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	tests := []struct {
		name     string
		remote   string
		header   string
		trustIDs bool
		ctxID    string
		want     string // "" means generated
	}{
		{"from trusted proxy", "127.0.0.1:1", "abc-123", true, "", "abc-123"},
		// Off by default: a proxy that passes the client's header
		// through must not let the client pick its idempotency key.
		{"from trusted proxy, not trusted for ids", "127.0.0.1:1", "abc-123", false, "", ""},
		{"from untrusted client", "192.0.2.1:1", "abc-123", true, "", ""},
		{"odd id from trusted proxy", "127.0.0.1:1", "a b<script>", true, "", ""},
		{"over-long id", "127.0.0.1:1", strings.Repeat("a", 129), true, "", ""},
		{"absent", "127.0.0.1:1", "", true, "", ""},
		{"context wins", "127.0.0.1:1", "abc-123", true, "outer", "outer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := allowAll()
			mw := httplimit.New(lim, httplimit.Config{TrustedProxies: prefixes("127.0.0.1/32"), TrustedRequestIDs: tt.trustIDs})
			req := newRequest(tt.remote)
			if tt.header != "" {
				req.Header.Set("X-Request-Id", tt.header)
			}
			if tt.ctxID != "" {
				req = req.WithContext(httplimit.ContextWithRequestID(req.Context(), tt.ctxID))
			}
			var inner string
			h := mw.Handler(gcra)(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				inner, _ = httplimit.RequestIDFromContext(r.Context())
			}))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			got := rec.Header().Get("X-Request-Id")
			if tt.want != "" && got != tt.want || tt.want == "" && !hex32.MatchString(got) {
				t.Errorf("X-Request-Id = %q, want %q (empty: generated)", got, tt.want)
			}
			if inner != got {
				t.Errorf("handler saw id %q, response says %q", inner, got)
			}
			if id := lim.DecideCalls()[0].Req.ID; id != got {
				t.Errorf("limiter got id %q, response says %q", id, got)
			}
		})
	}
}

func TestShadow(t *testing.T) {
	shadow := gcra
	shadow.Name, shadow.Shadow = "gcra-shadow", true
	refuse := ratelimit.Decision{Allowed: false, Limit: 100, Remaining: 0, RetryAfter: 3 * time.Second, ResetAfter: 10 * time.Second}
	admit := ratelimit.Decision{Allowed: true, Limit: 1000, Remaining: 900, ResetAfter: time.Minute}

	t.Run("alone never refuses", func(t *testing.T) {
		lim := scripted(map[string]ratelimit.Decision{"gcra-shadow": refuse})
		res := serve(httplimit.New(lim, httplimit.Config{}), newRequest("192.0.2.1:1"), shadow)
		if res.rec.Code != 200 || !res.next {
			t.Fatalf("status = %d, next %v", res.rec.Code, res.next)
		}
		h := res.rec.Header()
		if h.Get("RateLimit") != `"gcra-shadow";r=0;t=10` || h.Get("Retry-After") != "" {
			t.Errorf("headers = %v", h)
		}
		if len(lim.DecideCalls()) != 1 {
			t.Errorf("shadow policy not decided")
		}
	})
	t.Run("beside an enforced policy the headers are the enforced one's", func(t *testing.T) {
		lim := scripted(map[string]ratelimit.Decision{"gcra-shadow": refuse, "per-ip": admit})
		res := serve(httplimit.New(lim, httplimit.Config{}), newRequest("192.0.2.1:1"), shadow, perIP)
		if res.rec.Code != 200 || !res.next {
			t.Fatalf("status = %d", res.rec.Code)
		}
		if got := res.rec.Header().Get("RateLimit-Policy"); got != `"per-ip";q=1000;w=60` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
		if len(lim.DecideCalls()) != 2 {
			t.Errorf("Decide called %d times, want 2", len(lim.DecideCalls()))
		}
		sameAsSetHeaders(t, res.rec.Header(), []ratelimit.Policy{shadow, perIP}, []ratelimit.Decision{refuse, admit})
	})
}

// sameAsSetHeaders checks that httplimit.SetHeaders gives the rate-limit
// headers the middleware wrote for the same decisions.
func sameAsSetHeaders(t *testing.T, written http.Header, policies []ratelimit.Policy, ds []ratelimit.Decision) {
	t.Helper()
	got := http.Header{}
	httplimit.SetHeaders(got, policies, ds)
	for _, k := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
		if got.Get(k) != written.Get(k) {
			t.Errorf("SetHeaders: %s %q, the middleware wrote %q", k, got.Get(k), written.Get(k))
		}
	}
}

func TestMultiPolicy(t *testing.T) {
	admitFew := ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 3, ResetAfter: 9 * time.Second}
	admitMany := ratelimit.Decision{Allowed: true, Limit: 1000, Remaining: 500, ResetAfter: 30 * time.Second}
	admitFewLong := ratelimit.Decision{Allowed: true, Limit: 1000, Remaining: 3, ResetAfter: 50 * time.Second}
	refuseShort := ratelimit.Decision{Allowed: false, Limit: 100, RetryAfter: 2 * time.Second, ResetAfter: 10 * time.Second}
	refuseLong := ratelimit.Decision{Allowed: false, Limit: 1000, RetryAfter: 40 * time.Second, ResetAfter: 60 * time.Second}
	tests := []struct {
		name       string
		gcra, ip   ratelimit.Decision
		status     int
		wantPolicy string
		wantRetry  string
	}{
		{"both admit: fewest remaining", admitFew, admitMany, 200, "gcra", ""},
		{"both admit, other order", admitMany, admitFew, 200, "per-ip", ""},
		{"equal remaining: longest reset", admitFew, admitFewLong, 200, "per-ip", ""},
		{"one refuses", admitFew, refuseLong, 429, "per-ip", "40"},
		{"other refuses", refuseShort, admitMany, 429, "gcra", "2"},
		{"both refuse: longest retry", refuseShort, refuseLong, 429, "per-ip", "40"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := scripted(map[string]ratelimit.Decision{"gcra": tt.gcra, "per-ip": tt.ip})
			res := serve(httplimit.New(lim, httplimit.Config{}), newRequest("192.0.2.1:1"), gcra, perIP)
			if res.rec.Code != tt.status {
				t.Fatalf("status = %d, want %d", res.rec.Code, tt.status)
			}
			// Both policies listed, in the route's order; the X- trio is
			// the most restrictive one's.
			if got := res.rec.Header().Get("RateLimit-Policy"); got != `"gcra";q=100;w=10, "per-ip";q=1000;w=60` {
				t.Errorf("RateLimit-Policy = %q, want both policies", got)
			}
			wantLimit := map[string]string{"gcra": "100", "per-ip": "1000"}[tt.wantPolicy]
			if got := res.rec.Header().Get("X-RateLimit-Limit"); got != wantLimit {
				t.Errorf("X-RateLimit-Limit = %q, want %s (policy %s)", got, wantLimit, tt.wantPolicy)
			}
			if got := res.rec.Header().Get("Retry-After"); got != tt.wantRetry {
				t.Errorf("Retry-After = %q, want %q", got, tt.wantRetry)
			}
			if n := len(lim.DecideCalls()); n != 2 {
				t.Errorf("Decide called %d times, want every policy decided", n)
			}
			sameAsSetHeaders(t, res.rec.Header(), []ratelimit.Policy{gcra, perIP}, []ratelimit.Decision{tt.gcra, tt.ip})
			if tt.status == 429 {
				if p := decodeProblem(t, res.rec); p.Policy != tt.wantPolicy {
					t.Errorf("problem policy = %q", p.Policy)
				}
			}
		})
	}
}

// TestPerPolicyIdentity counts one policy per API key and another per IP on
// the same route, with a key function built from ClientIP and IPKey.
func TestPerPolicyIdentity(t *testing.T) {
	trusted := prefixes("127.0.0.1/32")
	lim := allowAll()
	mw := httplimit.New(lim, httplimit.Config{KeyFunc: func(r *http.Request, p ratelimit.Policy) (string, error) {
		if p.Name == "per-ip" {
			return httplimit.IPKey(httplimit.ClientIP(r, trusted)), nil
		}
		return httplimit.APIKeyPrefix + r.Header.Get("X-API-Key"), nil
	}})
	serve(mw, newRequest("127.0.0.1:1", "X-API-Key", "abc", "X-Real-IP", "203.0.113.9"), gcra, perIP)
	calls := lim.DecideCalls()
	if len(calls) != 2 || calls[0].Req.Key != "k:abc" || calls[1].Req.Key != "ip:203.0.113.9" {
		t.Errorf("calls = %+v", calls)
	}
}

func TestLimiterErrors(t *testing.T) {
	failing := limiterFunc(func(context.Context, ratelimit.Request) (ratelimit.Decision, error) {
		return ratelimit.Decision{}, fmt.Errorf("redisstore: %w: dial tcp: refused", ratelimit.ErrUnavailable)
	})
	t.Run("default fails open", func(t *testing.T) {
		res := serve(httplimit.New(failing, httplimit.Config{ServedBy: "app1"}), newRequest("192.0.2.1:1"), gcra)
		if res.rec.Code != 200 || !res.next {
			t.Fatalf("status = %d", res.rec.Code)
		}
		h := res.rec.Header()
		if h.Get("X-RateLimit-Mode") != "open" || h.Get("RateLimit") != `"gcra";r=100;t=0` {
			t.Errorf("headers = %v", h)
		}
	})
	t.Run("custom handler answers", func(t *testing.T) {
		var gotErr error
		mw := httplimit.New(failing, httplimit.Config{OnError: func(w http.ResponseWriter, _ *http.Request, _ ratelimit.Policy, err error) bool {
			gotErr = err
			w.WriteHeader(http.StatusTooManyRequests)
			return false
		}})
		res := serve(mw, newRequest("192.0.2.1:1"), gcra)
		if res.rec.Code != 429 || res.next || !errors.Is(gotErr, ratelimit.ErrUnavailable) {
			t.Errorf("status %d, next %v, err %v", res.rec.Code, res.next, gotErr)
		}
	})
}

// TestMemstore runs the middleware over the real in-memory limiter on a
// fixed clock.
func TestMemstore(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	lim := memstore.New(memstore.Config{Clock: func() time.Time { return now }})
	policy := ratelimit.Policy{Name: "tb", Algorithm: ratelimit.TokenBucket, Limit: 2, Window: 10 * time.Second}
	mw := httplimit.New(lim, httplimit.Config{ServedBy: "solo"})
	want := []struct {
		status    int
		rateLimit string
		retry     string
	}{
		{200, `"tb";r=1;t=5`, ""},
		{200, `"tb";r=0;t=10`, ""},
		{429, `"tb";r=0;t=10`, "5"},
	}
	for i, w := range want {
		res := serve(mw, newRequest("192.0.2.1:1"), policy)
		h := res.rec.Header()
		if res.rec.Code != w.status || h.Get("RateLimit") != w.rateLimit || h.Get("Retry-After") != w.retry ||
			h.Get("X-RateLimit-Mode") != "memory" {
			t.Errorf("request %d: %d %v", i, res.rec.Code, h)
		}
	}
	// Another client has its own budget.
	if res := serve(mw, newRequest("192.0.2.2:1"), policy); res.rec.Code != 200 {
		t.Errorf("other client: %d", res.rec.Code)
	}
	// Cost 2 takes the whole bucket at once.
	mwCost := httplimit.New(lim, httplimit.Config{Cost: func(*http.Request) int64 { return 2 }})
	if res := serve(mwCost, newRequest("192.0.2.3:1"), policy); res.rec.Code != 200 || res.rec.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("cost 2: %d %v", res.rec.Code, res.rec.Header())
	}
}

func TestHandlerPanicsOnBadPolicies(t *testing.T) {
	mw := httplimit.New(allowAll(), httplimit.Config{})
	for name, policies := range map[string][]ratelimit.Policy{
		"none":      nil,
		"invalid":   {{Name: "x", Algorithm: ratelimit.GCRA, Limit: 0, Window: time.Second}},
		"duplicate": {gcra, gcra},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			mw.Handler(policies...)
		})
	}
}

// TestCostAboveOneCapacity refuses a request that one policy can never
// admit before any policy counts it.
func TestCostAboveOneCapacity(t *testing.T) {
	lim := allowAll()
	mw := httplimit.New(lim, httplimit.Config{Cost: func(*http.Request) int64 { return 150 }})
	res := serve(mw, newRequest("192.0.2.1:1"), perIP, gcra) // capacities 1000 and 100
	if res.rec.Code != 400 || len(lim.DecideCalls()) != 0 {
		t.Errorf("status %d after %d decisions", res.rec.Code, len(lim.DecideCalls()))
	}
	decodeProblem(t, res.rec)
}

// batchRecorder is a ratelimit.BatchLimiter over a real in-memory limiter
// that records how requests arrived.
type batchRecorder struct {
	ratelimit.Limiter
	mu      sync.Mutex
	batches [][]ratelimit.Request
}

func (b *batchRecorder) DecideBatch(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, []error) {
	b.mu.Lock()
	b.batches = append(b.batches, slices.Clone(reqs))
	b.mu.Unlock()
	ds, errs := make([]ratelimit.Decision, len(reqs)), make([]error, len(reqs))
	for i, r := range reqs {
		ds[i], errs[i] = b.Limiter.Decide(ctx, r)
	}
	return ds, errs
}

// TestPerAddressCeiling: a client rotating API keys from one address is held
// to the per-address policy, and both policies are decided in one batch.
func TestPerAddressCeiling(t *testing.T) {
	perKey := ratelimit.Policy{Name: "per-key", Algorithm: ratelimit.GCRA, Limit: 5, Window: time.Minute}
	ceiling := ratelimit.Policy{Name: "per-address", Algorithm: ratelimit.SlidingWindowCounter, Limit: 20, Window: time.Minute}
	lim := &batchRecorder{Limiter: memstore.New(memstore.Config{})}
	mw := httplimit.New(lim, httplimit.Config{PerAddress: []string{"per-address"}})
	admitted := 0
	for i := range 100 {
		res := serve(mw, newRequest("192.0.2.7:1", "X-API-Key", fmt.Sprintf("key-%d", i)), perKey, ceiling)
		if res.next {
			admitted++
		}
	}
	if admitted != 20 {
		t.Errorf("rotating keys: %d admitted, want the ceiling's 20", admitted)
	}
	// Another address is not affected; one key is held to its own quota.
	admitted = 0
	for range 10 {
		if serve(mw, newRequest("192.0.2.8:1", "X-API-Key", "steady"), perKey, ceiling).next {
			admitted++
		}
	}
	if admitted != 5 {
		t.Errorf("one key: %d admitted, want its quota of 5", admitted)
	}
	if len(lim.batches) != 110 {
		t.Fatalf("%d batches, want one per request", len(lim.batches))
	}
	b := lim.batches[0]
	if len(b) != 2 || b[0].Key != "k:key-0" || b[1].Key != "ip:192.0.2.7" {
		t.Errorf("first batch = %+v, want the key's and the address's requests", b)
	}
	res := serve(mw, newRequest("192.0.2.9:1", "X-API-Key", "fresh"), perKey, ceiling)
	h := res.rec.Header()
	if got := h.Get("RateLimit-Policy"); got != `"per-key";q=5;w=60, "per-address";q=20;w=60` {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	// (the sliding window counter's t depends on where its window is)
	if got := h.Get("RateLimit"); !regexp.MustCompile(`^"per-key";r=4;t=12, "per-address";r=19;t=\d+$`).MatchString(got) {
		t.Errorf("RateLimit = %q", got)
	}
	if got := h.Get("X-RateLimit-Remaining"); got != "4" {
		t.Errorf("X-RateLimit-Remaining = %q, want the most restrictive policy's 4", got)
	}
}

// TestCheckedAPIKeys: a checked key counts under the identity it stands
// for; a refused key gets a 401, counts only against the per-address
// policy, and creates no state under the key; past the ceiling it gets 429.
func TestCheckedAPIKeys(t *testing.T) {
	perKey := ratelimit.Policy{Name: "per-key", Algorithm: ratelimit.GCRA, Limit: 5, Window: time.Minute}
	ceiling := ratelimit.Policy{Name: "per-address", Algorithm: ratelimit.SlidingWindowCounter, Limit: 8, Window: time.Minute}
	var seen []ratelimit.Request
	inner := memstore.New(memstore.Config{})
	lim := limiterFunc(func(ctx context.Context, r ratelimit.Request) (ratelimit.Decision, error) {
		seen = append(seen, r)
		return inner.Decide(ctx, r)
	})
	check := func(_ context.Context, key string) (string, error) {
		if id, ok := strings.CutSuffix(key, ".good"); ok {
			return id, nil
		}
		return "", errors.New("bad signature")
	}
	mw := httplimit.New(lim, httplimit.Config{APIKeys: check, PerAddress: []string{"per-address"}})

	res := serve(mw, newRequest("192.0.2.1:1", "X-API-Key", "alice.good"), perKey, ceiling)
	if res.rec.Code != 200 || seen[0].Key != "k:alice" {
		t.Fatalf("good key: status %d, key %q; want 200 under k:alice", res.rec.Code, seen[0].Key)
	}
	seen = nil
	for i := range 7 {
		res := serve(mw, newRequest("192.0.2.1:1", "X-API-Key", fmt.Sprintf("forged-%d.bad", i)), perKey, ceiling)
		if res.rec.Code != http.StatusUnauthorized || res.next {
			t.Fatalf("refused key %d: status %d, want 401", i, res.rec.Code)
		}
		if p := decodeProblem(t, res.rec); p.Type != "https://github.com/fleetlimit/fleetlimit/blob/main/docs/problems.md#invalid-api-key" {
			t.Errorf("problem type %q", p.Type)
		}
	}
	for _, r := range seen {
		if r.Policy.Name != "per-address" || r.Key != "ip:192.0.2.1" {
			t.Errorf("a refused key was counted as %s under %q, want per-address only", r.Policy.Name, r.Key)
		}
	}
	// The ceiling (8) is spent: 1 good request and 7 refused keys.
	res = serve(mw, newRequest("192.0.2.1:1", "X-API-Key", "forged.bad"), perKey, ceiling)
	if res.rec.Code != http.StatusTooManyRequests {
		t.Errorf("refused key past the ceiling: status %d, want 429", res.rec.Code)
	}
	// Without a per-address policy a refused key costs nothing and gets 401.
	seen = nil
	res = serve(mw, newRequest("192.0.2.2:1", "X-API-Key", "forged.bad"), perKey)
	if res.rec.Code != http.StatusUnauthorized || len(seen) != 0 {
		t.Errorf("status %d after %d decisions, want 401 and none", res.rec.Code, len(seen))
	}
}

// TestClientGoneRunsNoHandler: a request whose client went away before its
// decision finished (the limiter returns the context's error) does not run
// its handler, and is no store failure: the error handler, which fails
// open, is not asked.
func TestClientGoneRunsNoHandler(t *testing.T) {
	for _, cause := range []error{context.Canceled, context.DeadlineExceeded} {
		t.Run(cause.Error(), func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			lim := limiterFunc(func(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
				cancel(cause) // the client leaves while the store is asked
				<-ctx.Done()
				return ratelimit.Decision{}, fmt.Errorf("redisstore: %w", ctx.Err())
			})
			asked := false
			mw := httplimit.New(lim, httplimit.Config{OnError: func(http.ResponseWriter, *http.Request, ratelimit.Policy, error) bool {
				asked = true
				return true
			}})
			res := serve(mw, newRequest("192.0.2.1:1").WithContext(ctx), gcra, perIP)
			if res.next || asked {
				t.Fatalf("handler ran %v, error handler asked %v: want neither", res.next, asked)
			}
		})
	}
}

// TestCounted: the handler learns whether its request was counted by every
// policy: not when one failed open.
func TestCounted(t *testing.T) {
	cases := []struct {
		name string
		lim  ratelimit.Limiter
		want bool
	}{
		{"decided", allowAll(), true},
		{"failed open", limiterFunc(func(context.Context, ratelimit.Request) (ratelimit.Decision, error) {
			return ratelimit.Decision{}, fmt.Errorf("redisstore: %w: refused", ratelimit.ErrUnavailable)
		}), false},
		{"open failure mode", limiterFunc(func(_ context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
			return ratelimit.Decision{Allowed: true, Limit: req.Policy.Capacity(), Mode: ratelimit.ModeOpen}, nil
		}), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var counted, ok bool
			h := httplimit.New(c.lim, httplimit.Config{}).Handler(gcra)(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				counted, ok = httplimit.Counted(r.Context())
			}))
			h.ServeHTTP(httptest.NewRecorder(), newRequest("192.0.2.1:1"))
			if !ok || counted != c.want {
				t.Fatalf("Counted = %v, %v; want %v, true", counted, ok, c.want)
			}
		})
	}
}

// limiterFunc adapts a function to ratelimit.Limiter.
type limiterFunc func(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error)

func (f limiterFunc) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	return f(ctx, req)
}
