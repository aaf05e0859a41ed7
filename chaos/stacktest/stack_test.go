//go:build linux

package stacktest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/redis/go-redis/v9"
)

// demoRoutes are the contract's routes, one per algorithm.
var demoRoutes = []string{"/api/token-bucket", "/api/sliding-window-log", "/api/sliding-window-counter", "/api/gcra"}

// requestIDRe is the shape of nginx's $request_id.
var requestIDRe = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Deadlines of the outage check. The contract's chaos bounds are 1 s to the
// first local answer and 3 s from Redis' return to the first redis answer;
// these are looser, to hold on a loaded machine, and the measured times are
// logged.
const (
	failoverDeadline  = 5 * time.Second
	recoveryDeadline  = 10 * time.Second
	reconcileDeadline = 10 * time.Second
)

// TestNativeStack starts the native stack from the checkout on free ports and
// checks, through nginx, the contract's "HTTP through nginx" section, then
// SIGKILLs Redis and checks the fallback, the breaker and the journal's
// reconciliation after Redis is back. The subtests share the stack and run
// in order; the outage comes last.
func TestNativeStack(t *testing.T) {
	if testing.Short() {
		t.Skip("stacktest: starts the whole native stack; skipped with -short")
	}
	begin := time.Now()
	s := startStack(t)
	run := randomHex(4) // in every API key the test sends, so Redis can be searched for it

	// Each check sends from its own loopback address, so that none spends
	// another's per-address ceiling (1000 per 10 s over all routes).
	check := func(name, ip string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			s.from(ip)
			f(t)
		})
	}
	check("headers", "127.0.1.1", func(t *testing.T) { checkHeaders(t, s, run) })
	check("limited", "127.0.1.2", func(t *testing.T) { checkLimited(t, s, run) })
	check("instances", "127.0.1.3", func(t *testing.T) { checkInstances(t, s, run) })
	check("spoofed-forwarding", "127.0.1.4", func(t *testing.T) { checkSpoofedForwarding(t, s) })
	check("hostile-keys", "127.0.1.5", func(t *testing.T) { checkHostileKeys(t, s, run) })
	check("address-ceiling", "127.0.1.6", func(t *testing.T) { checkAddressCeiling(t, s, run) })
	check("slow-connections", "127.0.1.8", func(t *testing.T) { checkSlowConnections(t, s, run) })
	check("nginx-config", "127.0.1.10", func(t *testing.T) { checkNginxConfig(t, s) })
	check("reset", "127.0.1.15", func(t *testing.T) { checkReset(t, s, run) })
	check("auth-request", "127.0.1.12", func(t *testing.T) { checkAuthRequest(t, s, run) })
	check("rate-limit-service", "127.0.1.13", func(t *testing.T) { checkRateLimitService(t, s, run) })
	check("limiter-unreachable", "127.0.1.14", func(t *testing.T) { checkLimiterUnreachable(t, s, run) })
	check("client-reset", "127.0.1.18", func(t *testing.T) { checkClientReset(t, s, run) })
	check("redis-outage", "127.0.1.11", func(t *testing.T) { checkRedisOutage(t, s, run) })
	check("prometheus", "127.0.1.16", func(t *testing.T) { checkPrometheus(t, s) })
	check("reload", "127.0.1.17", func(t *testing.T) { checkReload(t, s) })
	t.Logf("stack up and checked in %v", time.Since(begin).Round(time.Millisecond))
}

// refill bounds how many units a policy of quota q per w seconds can give
// back within d: remaining may grow by at most this much between two
// decisions d apart (token bucket and GCRA refill continuously; the
// sliding window counter's previous window loses weight continuously).
func refill(q, w int64, d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds() * float64(q) / float64(w)))
}

// demoBody is the demo handler's JSON body.
type demoBody struct {
	Instance string `json:"instance"`
	Route    string `json:"route"`
	Policy   string `json:"policy"`
}

// checkHeaders: the headers and body of 200s, per route.
func checkHeaders(t *testing.T, s *stack, run string) {
	apps := s.appNames()
	policyRoute := map[string]string{} // policy name -> the route that showed it
	seenIDs := map[string]bool{}
	clientID := "client-chosen-" + run
	var sampleID, sampleApp string
	for _, route := range append(slices.Clone(demoRoutes), "/api/anything-else") {
		key := "hdr-" + run + route
		var first, prev rateHeaders
		var prevSent time.Time
		for i := range 6 {
			h := withKey(key)
			h.Set("X-Request-Id", clientID)
			r := s.mustGet(t, route, h)
			if r.status != http.StatusOK {
				t.Fatalf("%s #%d: status %d, want 200\n%s", route, i, r.status, r.body)
			}
			rh, err := parseRateHeaders(r.header)
			if err != nil {
				t.Fatalf("%s #%d: %v", route, i, err)
			}
			if rh.t > 2*rh.w {
				t.Errorf("%s #%d: t=%d, more than two windows (w=%d)", route, i, rh.t, rh.w)
			}
			if m := r.mode(); m != "redis" {
				t.Errorf("%s #%d: X-RateLimit-Mode %q, want redis", route, i, m)
			}
			by := r.servedBy()
			if !slices.Contains(apps, by) {
				t.Errorf("%s #%d: X-Served-By %q, want one of %v", route, i, by, apps)
			}
			id, err := single(r.header, "X-Request-Id")
			switch {
			case err != nil:
				t.Errorf("%s #%d: %v", route, i, err)
			case !requestIDRe.MatchString(id):
				t.Errorf("%s #%d: X-Request-Id %q is not nginx's 32 hex digits (the client sent %q)", route, i, id, clientID)
			case seenIDs[id]:
				t.Errorf("%s #%d: X-Request-Id %q seen twice", route, i, id)
			}
			seenIDs[id] = true
			sampleID, sampleApp = id, by

			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("%s #%d: Content-Type %q, want application/json", route, i, ct)
			}
			var body demoBody
			if err := json.Unmarshal(r.body, &body); err != nil {
				t.Fatalf("%s #%d: body: %v: %q", route, i, err, r.body)
			}
			if body.Instance != by || body.Policy != rh.policy || slices.Contains(demoRoutes, route) && body.Route != route {
				t.Errorf("%s #%d: body %+v; want instance %q (X-Served-By), policy %q, route %q", route, i, body, by, rh.policy, route)
			}

			if i == 0 {
				first = rh
				if rh.r != rh.q-1 {
					t.Errorf("%s: first request of a fresh key: r=%d, want q-1=%d", route, rh.r, rh.q-1)
				}
			} else {
				if rh.policy != prev.policy || rh.q != prev.q || rh.w != prev.w {
					t.Errorf("%s #%d: policy %+v changed from %+v", route, i, rh, prev)
				}
				// Each request takes one unit; at most refill(...) come back meanwhile.
				if allow := refill(rh.q, rh.w, r.recv.Sub(prevSent)); rh.r > prev.r-1+allow {
					t.Errorf("%s #%d: r went from %d to %d in %v (at most %d may refill)", route, i, prev.r, rh.r, r.recv.Sub(prevSent), allow)
				}
			}
			prev, prevSent = rh, r.sent
		}
		if prev.r >= first.r {
			t.Errorf("%s: r did not decrease over 6 requests: %d then %d", route, first.r, prev.r)
		}
		if other, dup := policyRoute[first.policy]; dup {
			t.Errorf("policy name %q is shown by both %s and %s", first.policy, other, route)
		}
		policyRoute[first.policy] = route
		t.Logf("%-28s RateLimit-Policy: %q;q=%d;w=%d  RateLimit after 6: r=%d;t=%d", route, first.policy, first.q, first.w, prev.r, prev.t)
	}

	// nginx's id is the one the app received and logged.
	logFile := filepath.Join(s.runDir, sampleApp+".log")
	if _, err := waitFor(3*time.Second, func() error {
		b, err := os.ReadFile(logFile)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), `"request_id":"`+sampleID+`"`) {
			return fmt.Errorf("%s does not log request_id %s", logFile, sampleID)
		}
		return nil
	}); err != nil {
		t.Errorf("X-Request-Id: %v", err)
	}
}

// checkLimited: exhausting each demo route's quota on one API key gets a
// 429 problem.
func checkLimited(t *testing.T, s *stack, run string) {
	for _, route := range demoRoutes {
		key := "burst-" + run + route
		start := time.Now()
		admitted, limited := exhaust(t, s, route, withKey(key), 1000)
		rh, err := parseRateHeaders(limited.header)
		if err != nil {
			t.Errorf("%s: the 429: %v", route, err)
		} else {
			if rh.r != 0 {
				t.Errorf("%s: the 429 says r=%d, want 0", route, rh.r)
			}
			if allow := refill(rh.q, rh.w, limited.recv.Sub(start)); int64(admitted) < rh.q || int64(admitted) > rh.q+allow {
				t.Errorf("%s: %d admitted before the first 429, want q=%d (up to %d more for refill over %v)", route, admitted, rh.q, allow, limited.recv.Sub(start))
			}
		}
		retry := checkRetryAfter(t, route, limited)
		t.Logf("%-28s %d admitted in %v, then 429 with Retry-After: %d", route, admitted, limited.recv.Sub(start).Round(time.Millisecond), retry)
	}
}

// exhaust sends GET route with the headers hdr until one gets a 429 (at
// most n), each decided in Redis, and returns how many were admitted before
// it, and the 429.
func exhaust(t *testing.T, s *stack, route string, hdr http.Header, n int) (int, reply) {
	t.Helper()
	admitted := 0
	for i := range n {
		r := s.mustGet(t, route, hdr)
		if m := r.mode(); m != "redis" {
			t.Fatalf("%s, request %d: X-RateLimit-Mode %q, want redis (a Redis call failed or timed out: see the app's log); status %d", route, i, m, r.status)
		}
		switch r.status {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			return admitted, r
		default:
			t.Fatalf("%s: status %d after %d admitted\n%s", route, r.status, admitted, r.body)
		}
	}
	t.Fatalf("%s: no 429 after %d requests", route, admitted)
	return admitted, reply{}
}

// checkRetryAfter checks a 429's Retry-After (an integer >= 1) and its
// problem body (retry_after equal to the header), and returns Retry-After.
func checkRetryAfter(t *testing.T, what string, r reply) int64 {
	t.Helper()
	v, err := single(r.header, "Retry-After")
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return 0
	}
	retry, err := strconv.ParseInt(v, 10, 64)
	if err != nil || retry < 1 {
		t.Errorf("%s: Retry-After %q, want an integer >= 1", what, v)
	}
	p, err := parseProblem(http.StatusTooManyRequests, r.header, r.body)
	switch {
	case err != nil:
		t.Errorf("%s: the 429: %v", what, err)
	case p.RetryAfter == nil || *p.RetryAfter != retry:
		t.Errorf("%s: problem retry_after %v, want %d (Retry-After)\n%s", what, p.RetryAfter, retry, r.body)
	}
	return retry
}

// checkInstances: nginx's round robin reaches all four instances.
func checkInstances(t *testing.T, s *stack, run string) {
	count := map[string]int{}
	for range 40 {
		r := s.mustGet(t, "/api/round-robin", withKey("rr-"+run))
		if r.status != http.StatusOK {
			t.Fatalf("status %d\n%s", r.status, r.body)
		}
		count[r.servedBy()]++
	}
	var got []string
	for name := range count {
		got = append(got, name)
	}
	slices.Sort(got)
	if !slices.Equal(got, s.appNames()) {
		t.Errorf("X-Served-By over 40 requests: %v, want each of %v", count, s.appNames())
	}
	t.Logf("X-Served-By over 40 requests: %v", count)
}

// checkSpoofedForwarding: without an API key the identity is the address
// nginx saw; X-Forwarded-For, X-Real-IP and Forwarded from the client do
// not change it. On a fresh sliding-window-log identity every admitted
// request takes exactly one unit, so r must count down by one whatever the
// client claims, and the quota ends in a 429.
func checkSpoofedForwarding(t *testing.T, s *stack) {
	const route = "/api/sliding-window-log" // no other check sends it requests without a key
	var q int64 = -1
	for i := 0; ; i++ {
		h := http.Header{}
		switch i % 4 {
		case 0:
			h.Set("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i%250))
		case 1:
			h.Set("X-Real-IP", fmt.Sprintf("198.51.100.%d", i%250))
		case 2:
			h.Set("X-Forwarded-For", fmt.Sprintf("192.0.2.%d, 2001:db8:%x::1", i%250, i))
			h.Set("X-Real-IP", fmt.Sprintf("2001:db8:%x::2", i))
		case 3:
			h.Set("Forwarded", fmt.Sprintf("for=203.0.113.%d", i%250))
			h.Add("X-Forwarded-For", "10.0.0.1")
			h.Add("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i%250))
		}
		r := s.mustGet(t, route, h)
		if m := r.mode(); m != "redis" {
			t.Fatalf("request %d: X-RateLimit-Mode %q, want redis (a Redis call failed or timed out: see the app's log); status %d", i, m, r.status)
		}
		if q < 0 {
			rh, err := parseRateHeaders(r.header)
			if err != nil {
				t.Fatal(err)
			}
			q = rh.q
		}
		if int64(i) == q {
			if r.status != http.StatusTooManyRequests {
				t.Errorf("request %d with spoofed headers %v: status %d, want 429: the quota %d of one identity is spent", i, h, r.status, q)
			}
			t.Logf("%d requests with %d different spoofed forwarding headers spent one quota (q=%d); the next got %d", q, q, q, r.status)
			return
		}
		if r.status != http.StatusOK {
			t.Fatalf("request %d with spoofed headers %v: status %d before the quota %d was spent\n%s", i, h, r.status, q, r.body)
		}
		rem, err := singleInt(r.header, "X-RateLimit-Remaining")
		if err != nil {
			t.Fatal(err)
		}
		if want := q - 1 - int64(i); rem != want {
			t.Fatalf("request %d with spoofed headers %v: remaining %d, want %d: the spoofed headers made a new identity", i, h, rem, want)
		}
	}
}

// hostileCase is one request with an odd X-API-Key.
type hostileCase struct {
	name string
	hdr  http.Header // sent with Go's client
	raw  string      // or this header line, over TCP (bytes Go's client refuses)
	want int         // 200 (a valid key), 401 (a key that is not one) or 400
	// problem: a 400 or 401 must be an RFC 9457 body. False where a layer before
	// the middleware answers (see the comments); the status is still
	// checked.
	problem bool
}

// checkHostileKeys: odd keys get a 400 or are hashed, never a 5xx; the
// stack keeps serving; no client key reaches Redis as is.
func checkHostileKeys(t *testing.T, s *stack, run string) {
	const route = "/api/sliding-window-log" // its Redis keys outlive the test's requests
	m := "hostile-" + run
	cases := []hostileCase{
		// Keys are checked before they are an identity: anything that is
		// not a key signed with the stack's secret gets a 401 problem.
		{name: "valid", hdr: withKey("valid-" + m), want: 200},
		{name: "hash tag", hdr: rawKey("{tag}"), want: 401, problem: true},
		{name: "hash tag with marker", hdr: rawKey("{" + m + "}"), want: 401, problem: true},
		{name: "unicode", hdr: rawKey("ключ-🔑-" + m), want: 401, problem: true},
		{name: "invalid UTF-8", hdr: rawKey("\x80\xfe\xff-" + m), want: 401, problem: true},
		{name: "254 bytes (the longest)", hdr: rawKey(m + strings.Repeat("x", 254-len(m))), want: 401, problem: true},
		{name: "signed with another secret", hdr: rawKey(mustSign("another-secret-0123456789", "forged-"+m)), want: 401, problem: true},
		{name: "valid id, forged mac", hdr: rawKey("forged-" + m + ".AAAAAAAAAAAAAAAAAAAAAAAA"), want: 401, problem: true},
		{name: "255 bytes", hdr: rawKey(m + strings.Repeat("x", 255-len(m))), want: 400, problem: true},
		{name: "tab", hdr: rawKey("a\tb-" + m), want: 400, problem: true},
		{name: "empty", hdr: rawKey(""), want: 400, problem: true},
		{name: "two keys", hdr: http.Header{"X-Api-Key": {"a-" + m, "b-" + m}}, want: 400, problem: true},
		// nginx refuses a header line over large_client_header_buffers
		// (8k), and a control character in X-API-Key before Go's HTTP
		// server would, both with the apps' problem body.
		{name: "10 kB", hdr: rawKey(m + strings.Repeat("k", 10<<10)), want: 400, problem: true},
		{name: "SOH (raw)", raw: "X-API-Key: a\x01b-" + m, want: 400, problem: true},
		{name: "ESC (raw)", raw: "X-API-Key: \x1b[31mred-" + m, want: 400, problem: true},
		{name: "DEL (raw)", raw: "X-API-Key: a\x7fb-" + m, want: 400, problem: true},
		{name: "NUL (raw)", raw: "X-API-Key: a\x00b-" + m, want: 400, problem: true},
		{name: "bare CR (raw)", raw: "X-API-Key: a\rb-" + m, want: 400, problem: true},
	}
	for _, c := range cases {
		var status int
		var header http.Header
		var body []byte
		if c.raw != "" {
			resp, b, err := s.rawGet(route, c.raw)
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
				continue
			}
			status, header, body = resp.StatusCode, resp.Header, b
		} else {
			r, err := s.get(route, c.hdr)
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
				continue
			}
			status, header, body = r.status, r.header, r.body
		}
		if status != c.want {
			t.Errorf("%s: status %d, want %d\n%.300q", c.name, status, c.want, body)
			continue
		}
		answeredBy := header.Get("X-Served-By")
		if answeredBy == "" {
			answeredBy = "nginx or Go's http.Server"
		}
		if status == http.StatusBadRequest || status == http.StatusUnauthorized {
			_, err := parseProblem(status, header, body)
			switch {
			case err == nil:
				t.Logf("%-24s %d problem (%s)", c.name, status, answeredBy)
			case c.problem:
				t.Errorf("%s: %v", c.name, err)
			default:
				t.Logf("%-24s %d, NOT a problem body: %s, %q (%s)", c.name, status, header.Get("Content-Type"), firstLine(body), answeredBy)
			}
		} else {
			t.Logf("%-24s 200 (%s)", c.name, answeredBy)
		}
	}

	// Every instance is still up and serving.
	for _, a := range s.info.Apps {
		if !processRunning(a.PID) {
			t.Errorf("%s (pid %d) is gone", a.Name, a.PID)
		}
	}
	served := map[string]bool{}
	for range 8 {
		r := s.mustGet(t, "/api/after-hostile", withKey("after-"+run))
		if r.status != http.StatusOK {
			t.Errorf("after the hostile keys: status %d", r.status)
		}
		served[r.servedBy()] = true
	}
	if len(served) != len(s.info.Apps) {
		t.Errorf("after the hostile keys only %v answered", served)
	}

	// No client key is a Redis key, or part of one, as is.
	rdb := redis.NewClient(&redis.Options{Addr: s.info.RedisAddr, Password: s.password, DisableIdentity: true})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var keys []string
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("redis SCAN: %v", err)
	}
	if len(keys) == 0 {
		t.Fatal("redis holds no key at all: the scan looked at the wrong server")
	}
	for _, k := range keys {
		for _, raw := range []string{run, "{tag}", "ключ"} {
			if strings.Contains(k, raw) {
				t.Errorf("redis key %q holds the client's %q as is", k, raw)
			}
		}
	}
	t.Logf("redis: %d keys, none holds a client key (e.g. %q)", len(keys), keys[0])
}

func firstLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

// checkNginxConfig: `nginx -t` on the config local-up.sh rendered for this
// stack. scripts/check-config.sh (make test) runs nginx -t on a rendering
// with the default ports; this one is the file nginx actually serves from.
func checkNginxConfig(t *testing.T, s *stack) {
	dir := filepath.Join(s.runDir, "nginx")
	cmd := exec.Command(findBin("nginx"), "-t", "-q", "-p", dir+"/", "-c", filepath.Join(dir, "nginx.conf"),
		"-e", filepath.Join(dir, "error.log"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("nginx -t: %v\n%s", err, out)
	}
}

// checkRedisOutage: SIGKILL Redis; the fleet answers from its fallback
// budget (mode local) with correct 200s and 429s and the breakers open;
// Redis restarted, the fleet answers from Redis again and every journal
// reconciles with nothing pending.
func checkRedisOutage(t *testing.T, s *stack, run string) {
	const probePath = "/api/outage-probe"
	probeKey := "probe-" + run

	// Only our own redis-server: its working directory is the --dir that
	// local-up.sh gave it, in our run dir.
	pid := s.info.RedisPID
	cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if cl := cmdline(pid); !strings.Contains(cl, "redis-server") || cwd != filepath.Join(s.runDir, "redis") {
		t.Fatalf("redis_pid %d is %q in %q, not this test's redis-server", pid, cl, cwd)
	}
	killed := time.Now()
	if err := kill(pid); err != nil {
		t.Fatalf("kill redis: %v", err)
	}

	first, all := s.waitFleetMode(t, "local", probePath, probeKey, failoverDeadline)
	t.Logf("failover: first local answer %v after the SIGKILL, all four instances local after %v", first, all)

	if d, err := waitFor(3*time.Second, func() error {
		for _, a := range s.info.Apps {
			st, err := s.status(a)
			if err != nil {
				return err
			}
			if st.Breaker != "open" || st.Mode != "local" {
				return fmt.Errorf("%s /status: breaker %q mode %q, want open and local", a.Name, st.Breaker, st.Mode)
			}
		}
		return nil
	}); err != nil {
		t.Errorf("during the outage: %v", err)
	} else {
		t.Logf("/status: every breaker open %v after the SIGKILL (%v of polling)", time.Since(killed).Round(time.Millisecond), d.Round(time.Millisecond))
	}

	// The fallback budget on a key fresh to the fleet: each instance grants
	// its share of the quota, then refuses with a proper 429.
	const route = "/api/sliding-window-log"
	key := "fallback-" + run
	var q int64
	admitted := 0
	refusedBy := map[string]bool{}
	var firstGrant time.Time
	checked429 := false
	for i := 0; i < 400 && len(refusedBy) < len(s.info.Apps); i++ {
		r := s.mustGet(t, route, withKey(key))
		if m := r.mode(); m != "local" {
			t.Fatalf("outage, request %d: X-RateLimit-Mode %q, want local", i, m)
		}
		rh, err := parseRateHeaders(r.header)
		if err != nil {
			t.Fatalf("outage, request %d: %v", i, err)
		}
		q = rh.q
		switch r.status {
		case http.StatusOK:
			admitted++
			if firstGrant.IsZero() {
				firstGrant = r.sent
			}
		case http.StatusTooManyRequests:
			refusedBy[r.servedBy()] = true
			if !checked429 {
				checkRetryAfter(t, "outage 429", r)
				checked429 = true
			}
		default:
			t.Fatalf("outage, request %d: status %d\n%s", i, r.status, r.body)
		}
	}
	if len(refusedBy) < len(s.info.Apps) {
		t.Errorf("outage: only %v refused a key after its quota", refusedBy)
	}
	// The fleet as a whole stays within the quota, and (the contract's
	// goodput bound during a fault) grants at least 70% of it.
	if int64(admitted) > q || float64(admitted) < 0.7*float64(q) {
		t.Errorf("outage: the fleet admitted %d on a fresh key, want between 0.7q and q=%d", admitted, q)
	}
	t.Logf("outage: the fallback budgets admitted %d of q=%d on a fresh key, then every instance refused", admitted, q)

	// Redis back, with its data (AOF).
	restart := time.Now()
	if out, err := s.script("local-service.sh", "start", "redis"); err != nil {
		t.Fatalf("local-service.sh start redis: %v\n%s", err, out)
	}
	up := time.Now()
	s.readInfo(t)
	if s.info.RedisPID == pid || !processRunning(s.info.RedisPID) {
		t.Errorf("stack.json after the restart: redis_pid %d (was %d)", s.info.RedisPID, pid)
	}
	first, all = s.waitFleetMode(t, "redis", probePath, probeKey, recoveryDeadline)
	t.Logf("recovery: local-service.sh start redis took %v; first redis answer %v after Redis was ready, all four %v",
		up.Sub(restart).Round(time.Millisecond), first, all)

	var stats map[string]resilient.JournalStats
	d, err := waitFor(reconcileDeadline, func() error {
		stats = map[string]resilient.JournalStats{}
		for _, a := range s.info.Apps {
			st, err := s.status(a)
			if err != nil {
				return err
			}
			j := st.Limiter.Journal
			stats[a.Name] = j
			if st.Breaker != "closed" || st.Mode != "redis" {
				return fmt.Errorf("%s /status: breaker %q mode %q, want closed and redis", a.Name, st.Breaker, st.Mode)
			}
			if err := j.Reconcile(); err != nil {
				return fmt.Errorf("%s: %w", a.Name, err)
			}
			if j.Pending != 0 {
				return fmt.Errorf("%s: journal pending %d, want 0", a.Name, j.Pending)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	var granted uint64
	for _, a := range s.info.Apps {
		j := stats[a.Name]
		t.Logf("%s journal: %+v", a.Name, j)
		granted += j.Granted
		if j.Overflow != 0 || j.Reloaded != 0 || j.DuplicateUnits != 0 {
			t.Errorf("%s journal: overflow %d, reloaded %d, duplicate_units %d; want 0 each", a.Name, j.Overflow, j.Reloaded, j.DuplicateUnits)
		}
	}
	s.mu.Lock()
	local, answered := s.localAdmitted, s.localAnswered
	s.mu.Unlock()
	if granted != uint64(local+answered) {
		t.Errorf("the journals granted %d in all, but the test got %d 200s answered locally (route policies) and %d local answers (the per-address ceiling): %d",
			granted, local, answered, local+answered)
	}
	t.Logf("journals reconciled %v after all four answered from Redis: %d local grants, all replayed, none pending", d.Round(time.Millisecond), granted)

	// Redis knows what the fallback granted: the fresh key's local grants
	// were replayed, so the fleet admits at most what is left of the quota.
	// (Only while those grants are still in the window.)
	if time.Since(firstGrant) > 8*time.Second {
		t.Logf("replay cross-check skipped: %v since the first local grant, too close to the window's end", time.Since(firstGrant))
		return
	}
	more := 0
	for i := 0; ; i++ {
		r := s.mustGet(t, route, withKey(key))
		if m := r.mode(); m != "redis" {
			t.Fatalf("after recovery, request %d: X-RateLimit-Mode %q, want redis", i, m)
		}
		if r.status == http.StatusTooManyRequests {
			break
		}
		more++
		if int64(admitted+more) > q {
			t.Fatalf("after recovery Redis admitted %d more on the key the fallback granted %d: over q=%d; the replay did not reach Redis", more, admitted, q)
		}
	}
	t.Logf("replay cross-check: Redis admitted %d more on that key before a 429 (fallback %d + %d <= q=%d)", more, admitted, more, q)
}

// waitFleetMode sends requests until the latest answer of every instance
// carries X-RateLimit-Mode want. Every answer must be a 200 or a 429 with
// well-formed rate-limit headers. It returns the time from its start to
// the first answer in that mode and to all four.
func (s *stack) waitFleetMode(t *testing.T, want, path, key string, deadline time.Duration) (first, all time.Duration) {
	t.Helper()
	start := time.Now()
	latest := map[string]string{}
	for i := 0; ; i++ {
		r := s.mustGet(t, path, withKey(key))
		if r.status != http.StatusOK && r.status != http.StatusTooManyRequests {
			t.Fatalf("waiting for mode %s, request %d: status %d\n%s", want, i, r.status, r.body)
		}
		if _, err := parseRateHeaders(r.header); err != nil {
			t.Fatalf("waiting for mode %s, request %d (mode %q): %v", want, i, r.mode(), err)
		}
		latest[r.servedBy()] = r.mode()
		elapsed := time.Since(start).Round(time.Millisecond)
		if r.mode() == want && first == 0 {
			first = elapsed
		}
		done := true
		for _, a := range s.info.Apps {
			done = done && latest[a.Name] == want
		}
		if done {
			return first, elapsed
		}
		if elapsed > deadline {
			t.Fatalf("after %v the instances' latest modes are %v, want all %q", elapsed, latest, want)
		}
		time.Sleep(pollInterval)
	}
}

func kill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

// checkClientReset: clients that reset their connections right after
// sending, against a spent key, never get its handler run without a
// counted decision: every app's uncounted_requests stays 0, and the sliding
// window log's route (whose spent key frees nothing within the check)
// answers no 200 that Redis admitted. A 200 may only be a local share's
// grant: on a loaded host a call times out, and an instance that has no
// reply for the key yet (an app restarted by the check before) grants from
// its share of the quota (docs/GUARANTEES.md, "A call that timed out but
// ran").
func checkClientReset(t *testing.T, s *stack, run string) {
	route, policy := "/api/sliding-window-log", "sliding-window-log"
	key := "reset-" + run
	hdr := withKey(key)
	exhaust(t, s, route, hdr, 1000)
	before := s.counters(t, route, policy)
	if before.redisGrants == 0 {
		t.Fatalf("no %s admissions by Redis in ratelimit_decisions_total after spending the key: the metric was not read", policy)
	}
	addr := strings.TrimPrefix(s.info.NginxURL, "http://")
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nX-API-Key: %s\r\n\r\n", route, addr, hdr.Get("X-Api-Key"))
	for i := range 400 {
		conn, err := s.dial(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.(*net.TCPConn).SetLinger(0) // Close sends a reset
		_, _ = io.WriteString(conn, req)
		if i%2 == 1 {
			time.Sleep(time.Duration(i%5) * time.Millisecond)
		}
		_ = conn.Close()
	}
	time.Sleep(200 * time.Millisecond) // the apps finish what reached them
	after := s.counters(t, route, policy)
	local := after.localGrants - before.localGrants
	if after.uncounted != before.uncounted || after.ok-before.ok > local || after.redisGrants != before.redisGrants {
		t.Errorf("after 400 resets against a spent key: uncounted %v -> %v, %s 200s %v -> %v, admitted by Redis %v -> %v, "+
			"by local shares %v more; want uncounted and Redis' admissions unchanged, and no 200 but local grants",
			before.uncounted, after.uncounted, route, before.ok, after.ok, before.redisGrants, after.redisGrants, local)
	}
	if local > 0 {
		t.Logf("%v requests were granted by local shares (calls that timed out)", local)
	}
	t.Logf("%d requests reached the apps and ended without an answer (499)", int(after.gone-before.gone))
}

// fleetCounters are counters summed over the instances.
type fleetCounters struct {
	uncounted, ok, gone      float64
	redisGrants, localGrants float64 // the policy's admissions by mode
}

// counters reads every instance's uncounted_requests (/status), its
// route's 200s and 499s, and policy's admissions by Redis and by local
// shares (/metrics).
func (s *stack) counters(t *testing.T, route, policy string) fleetCounters {
	t.Helper()
	var c fleetCounters
	for _, a := range s.info.Apps {
		resp, err := s.client.Get(a.AdminURL + "/status")
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Uncounted float64 `json:"uncounted_requests"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		c.uncounted += st.Uncounted
		resp, err = s.client.Get(a.AdminURL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		for _, l := range strings.Split(string(body), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			switch {
			case strings.HasPrefix(l, "ratelimit_http_requests_total{") && strings.Contains(l, `route="`+route+`"`):
				switch {
				case strings.Contains(l, `code="200"`):
					c.ok += v
				case strings.Contains(l, `code="499"`):
					c.gone += v
				}
			case strings.HasPrefix(l, "ratelimit_decisions_total{") && strings.Contains(l, `policy="`+policy+`"`) &&
				strings.Contains(l, `result="allowed"`):
				switch {
				case strings.Contains(l, `mode="redis"`):
					c.redisGrants += v
				case strings.Contains(l, `mode="local"`):
					c.localGrants += v
				}
			}
		}
	}
	return c
}
