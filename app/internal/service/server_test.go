package service

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
)

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startServer starts the service on loopback port 0 with env added to the
// defaults, and stops it at the end of the test.
func startServer(t *testing.T, env map[string]string) (*Server, *syncBuffer) {
	t.Helper()
	all := map[string]string{
		"RL_INSTANCE":       "test-1",
		"RL_LISTEN_ADDR":    "127.0.0.1:0",
		"RL_ADMIN_ADDR":     "127.0.0.1:0",
		"RL_JOURNAL_DIR":    t.TempDir(),
		"RL_API_KEY_SECRET": testSecret,
	}
	for k, v := range env {
		all[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	stdout := &syncBuffer{}
	s, err := Start(ctx, envOf(all), stdout, io.Discard)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := s.Wait(); err != nil {
			t.Errorf("Wait: %v", err)
		}
	})
	return s, stdout
}

var client = &http.Client{Timeout: 5 * time.Second}

// testSecret signs the tests' API keys.
const testSecret = "service-test-secret-0123456789"

// signed returns the API key for id under testSecret.
func signed(t *testing.T, id string) string {
	t.Helper()
	v, err := apikey.NewVerifier(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	k, err := v.Sign(id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func get(t *testing.T, url string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		v := headers[i+1]
		if headers[i] == "X-API-Key" && apikey.ValidID(v) == nil {
			v = signed(t, v) // an id: send its key; anything else as it is
		}
		req.Header.Set(headers[i], v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

var demoRoutes = []struct{ path, route, policy string }{
	{"/api/token-bucket", "/api/token-bucket", "token-bucket"},
	{"/api/sliding-window-log", "/api/sliding-window-log", "sliding-window-log"},
	{"/api/sliding-window-counter", "/api/sliding-window-counter", "sliding-window-counter"},
	{"/api/gcra", "/api/gcra", "gcra"},
	{"/api/anything/else", "/api/*", "default"},
}

func TestDemoRoutes(t *testing.T) {
	s, logs := startServer(t, map[string]string{"RL_DEBUG_HEADERS": "true", "RL_LOG_LEVEL": "debug", "RL_TRUST_REQUEST_ID": "true"})
	base := "http://" + s.PublicAddr()
	for _, r := range demoRoutes {
		t.Run(r.policy, func(t *testing.T) {
			resp, body := get(t, base+r.path, "X-API-Key", "first-"+r.policy, "X-Request-Id", "req-"+r.policy)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var got struct {
				Instance, Route, Policy string
				Policies                []string
			}
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			if got.Instance != "test-1" || got.Route != r.route || got.Policy != r.policy ||
				!slices.Equal(got.Policies, []string{r.policy, "per-address"}) {
				t.Errorf("body = %+v", got)
			}
			name := strconv.Quote(r.policy)
			for k, want := range map[string]string{
				// The route's policy first, then the per-address ceiling.
				"RateLimit-Policy":      name + `;q=100;w=10, "per-address";q=1000;w=10`,
				"X-RateLimit-Limit":     "100",
				"X-RateLimit-Remaining": "99",
				"X-Request-Id":          "req-" + r.policy, // the test client is on 127.0.0.1, a trusted proxy
				"X-Served-By":           "test-1",
				"X-RateLimit-Mode":      "memory",
			} {
				if v := resp.Header.Get(k); v != want {
					t.Errorf("%s = %q, want %q", k, v, want)
				}
			}
			if v := resp.Header.Get("RateLimit"); !strings.HasPrefix(v, name+";r=99;t=") || !strings.Contains(v, `, "per-address";r=`) {
				t.Errorf("RateLimit = %q", v)
			}
			if v, err := strconv.Atoi(resp.Header.Get("X-RateLimit-Reset")); err != nil || v < 1 || v > 20 {
				t.Errorf("X-RateLimit-Reset = %q", resp.Header.Get("X-RateLimit-Reset"))
			}
		})
	}
	if !strings.Contains(logs.String(), `"request_id":"req-gcra"`) {
		t.Errorf("request id not logged:\n%s", logs)
	}
}

// At the default level the hot path writes no line per request (nginx's
// access log has them); at debug it does.
func TestRequestLogOnlyAtDebug(t *testing.T) {
	s, logs := startServer(t, map[string]string{"RL_TRUST_REQUEST_ID": "true"})
	for i := range 20 {
		resp, _ := get(t, "http://"+s.PublicAddr()+"/api/gcra", "X-Request-Id", fmt.Sprint("quiet-", i))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if strings.Contains(logs.String(), "quiet-") {
		t.Errorf("a request was logged at info:\n%s", logs)
	}
}

// TestLimitReached sends one key past its quota on every demo route: the
// first 100 requests are admitted whatever the algorithm, then a 429 with a
// problem body follows (token bucket and GCRA refill one request per 100 ms,
// so a slow machine may admit a few more first).
func TestLimitReached(t *testing.T) {
	s, _ := startServer(t, nil)
	base := "http://" + s.PublicAddr()
	for _, r := range demoRoutes {
		t.Run(r.policy, func(t *testing.T) {
			key := "abuser-" + r.policy
			for i := 1; i <= 100; i++ {
				resp, _ := get(t, base+r.path, "X-API-Key", key)
				if resp.StatusCode != 200 {
					t.Fatalf("request %d: status %d", i, resp.StatusCode)
				}
			}
			for i := 101; ; i++ {
				if i > 150 {
					t.Fatal("no 429 within 150 requests")
				}
				resp, body := get(t, base+r.path, "X-API-Key", key)
				if resp.StatusCode == 200 {
					continue
				}
				if resp.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("request %d: status %d", i, resp.StatusCode)
				}
				checkProblem(t, resp, body, r.policy)
				break
			}
			// Another key is unaffected.
			if resp, _ := get(t, base+r.path, "X-API-Key", "polite-"+r.policy); resp.StatusCode != 200 {
				t.Errorf("other key: status %d", resp.StatusCode)
			}
		})
	}
}

// TestRouteWithoutLimits: a route whose policy list is empty is served
// without limits (no rate-limit headers, never a 429), beside a limited
// one.
func TestRouteWithoutLimits(t *testing.T) {
	file := t.TempDir() + "/policies.json"
	policies := `{"policies": [{"name": "tiny", "algorithm": "gcra", "limit": 2, "window": "1m"}],
		"routes": [{"pattern": "/api/free", "policies": []}, {"pattern": "/api/*", "policies": ["tiny"]}]}`
	if err := os.WriteFile(file, []byte(policies), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ := startServer(t, map[string]string{"RL_POLICY_FILE": file})
	base := "http://" + s.PublicAddr()
	for i := range 10 {
		resp, body := get(t, base+"/api/free", "X-API-Key", "k")
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") != "" {
			t.Fatalf("free request %d: status %d, RateLimit-Policy %q", i, resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
		}
		var b struct {
			Policy   *string  `json:"policy"`
			Policies []string `json:"policies"`
		}
		if err := json.Unmarshal(body, &b); err != nil || b.Policy == nil || *b.Policy != "" || b.Policies == nil || len(b.Policies) != 0 {
			t.Fatalf("free request %d: body %s (%v), want policy \"\" and policies []", i, body, err)
		}
	}
	codes := []int{}
	for range 3 {
		resp, _ := get(t, base+"/api/other", "X-API-Key", "k")
		codes = append(codes, resp.StatusCode)
	}
	if !slices.Equal(codes, []int{200, 200, 429}) {
		t.Errorf("limited route: statuses %v, want [200 200 429]", codes)
	}
}

func checkProblem(t *testing.T, resp *http.Response, body []byte, policy string) {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q", ct)
	}
	// Every demo policy's window is 10 s. A sliding window counter can ask
	// for longer: a window filled in its first 100 ms frees a request only
	// once the next window is 1/100 in (the full window counts as the
	// previous one until then), so its wait is up to 10.1 s, 11 in whole
	// seconds. At most two windows.
	maxRetry := 10
	if policy == "sliding-window-counter" {
		maxRetry = 20
	}
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > maxRetry {
		t.Errorf("Retry-After = %q", resp.Header.Get("Retry-After"))
	}
	var p struct {
		Type       string `json:"type"`
		Title      string `json:"title"`
		Status     int    `json:"status"`
		Detail     string `json:"detail"`
		RetryAfter int    `json:"retry_after"`
		Policy     string `json:"policy"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("problem %q: %v", body, err)
	}
	if p.Type != "https://github.com/fleetlimit/fleetlimit/blob/main/docs/problems.md#rate-limited" || p.Title == "" || p.Status != 429 || p.Detail == "" ||
		p.RetryAfter != retry || p.Policy != policy {
		t.Errorf("problem = %+v", p)
	}
	if resp.Header.Get("RateLimit-Policy") == "" || resp.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("rate-limit headers missing on the 429: %v", resp.Header)
	}
}

func TestBadKeyIs400(t *testing.T) {
	s, _ := startServer(t, nil)
	resp, body := get(t, "http://"+s.PublicAddr()+"/api/gcra", "X-API-Key", strings.Repeat("k", 300))
	if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("status %d %s", resp.StatusCode, body)
	}
}

func TestAdminEndpoints(t *testing.T) {
	s, _ := startServer(t, nil)
	for range 3 {
		get(t, "http://"+s.PublicAddr()+"/api/gcra", "X-API-Key", "metered")
	}
	admin := "http://" + s.AdminAddr()
	for _, path := range []string{"/healthz", "/readyz"} {
		if resp, body := get(t, admin+path); resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", path, resp.StatusCode, body)
		}
	}

	resp, body := get(t, admin+"/status")
	if resp.StatusCode != 200 {
		t.Fatalf("/status: %d", resp.StatusCode)
	}
	var st map[string]any
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"instance", "mode", "breaker", "live_instances", "journal_size", "last_reconciliation"} {
		if _, ok := st[k]; !ok {
			t.Errorf("/status lacks %q: %s", k, body)
		}
	}
	if st["instance"] != "test-1" || st["mode"] != "memory" || st["live_instances"] != 1.0 || st["ready"] != true {
		t.Errorf("/status = %s", body)
	}

	resp, body = get(t, admin+"/metrics")
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	for _, want := range []string{
		`ratelimit_decisions_total{mode="memory",policy="gcra",result="allowed"} 3`,
		`ratelimit_http_requests_total{code="200",route="/api/gcra"} 3`,
		`ratelimit_live_instances 1`,
		`ratelimit_local_keys 2`, // the key's and the address's
		`go_goroutines`,
	} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if resp, _ := get(t, "http://"+s.PublicAddr()+"/metrics"); resp.StatusCode != 404 {
		t.Errorf("/metrics on the public port: %d", resp.StatusCode)
	}
}

// TestRedisUnreachable starts in Redis mode against a port nobody listens
// on: the start succeeds, the instance is ready, and requests are answered
// by the local fallback budget (a quarter of the quota per key with 4
// expected instances), counted and journaled.
func TestRedisUnreachable(t *testing.T) {
	s, logs := startServer(t, map[string]string{
		"RL_REDIS_URL":          "redis://" + deadAddr(t) + "/0",
		"RL_REDIS_TIMEOUT":      "50ms",
		"RL_DEBUG_HEADERS":      "true",
		"RL_EXPECTED_INSTANCES": "4",
	})
	if resp, _ := get(t, "http://"+s.AdminAddr()+"/readyz"); resp.StatusCode != 200 {
		t.Errorf("/readyz: %d", resp.StatusCode)
	}
	codes := map[int]int{}
	for range 30 {
		resp, body := get(t, "http://"+s.PublicAddr()+"/api/gcra", "X-API-Key", "k")
		codes[resp.StatusCode]++
		if resp.Header.Get("X-RateLimit-Mode") != "local" || resp.Header.Get("RateLimit") == "" {
			t.Errorf("status %d, headers %v, body %s", resp.StatusCode, resp.Header, body)
		}
	}
	if codes[200] != 25 || codes[429] != 5 {
		t.Errorf("answers %v, want 25 admitted (a quarter of 100) and 5 limited", codes)
	}
	// Journaled: the key's 25 grants and the 30 of the per-address ceiling
	// (it admitted all 30 requests).
	_, body := get(t, "http://"+s.AdminAddr()+"/status")
	for _, want := range []string{`"mode":"local"`, `"breaker":"open"`, `"granted":55`, `"journal_size":55`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/status lacks %s: %s", want, body)
		}
	}
	_, body = get(t, "http://"+s.AdminAddr()+"/metrics")
	for _, want := range []string{`ratelimit_breaker_transitions_total{from="closed",to="open"} 1`, `ratelimit_journal_units_total{what="granted"} 55`, `ratelimit_journal_problems_total{what="corrupt_line"} 0`, `ratelimit_cached_refusals_total `, `ratelimit_decisions_total{mode="local",policy="gcra",result="allowed"} 25`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %s:\n%s", want, grep(body, "ratelimit_"))
		}
	}
	if !strings.Contains(logs.String(), "breaker transition") {
		t.Errorf("no breaker transition logged:\n%s", logs.String())
	}
}

func grep(body []byte, substr string) string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		if strings.Contains(sc.Text(), substr) && !strings.HasPrefix(sc.Text(), "#") {
			out = append(out, sc.Text())
		}
	}
	return strings.Join(out, "\n")
}

func TestShutdown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	stdout := &syncBuffer{}
	s, err := Start(ctx, envOf(map[string]string{
		"RL_INSTANCE": "test-1", "RL_LISTEN_ADDR": "127.0.0.1:0", "RL_ADMIN_ADDR": "127.0.0.1:0",
	}), stdout, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	public := s.PublicAddr()
	if resp, _ := get(t, "http://"+public+"/api/gcra"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	cancel()
	done := make(chan error)
	go func() { done <- s.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(ShutdownTimeout + 2*time.Second):
		t.Fatal("no shutdown")
	}
	if _, err := net.DialTimeout("tcp", public, time.Second); err == nil {
		t.Error("still accepting after shutdown")
	}
	if !strings.Contains(stdout.String(), `"msg":"stopped"`) {
		t.Errorf("no stop logged:\n%s", stdout)
	}
	// Once shutdown has begun, /readyz says 503.
	rec := &recorder{header: http.Header{}}
	s.readyz(rec, nil)
	if rec.status != http.StatusServiceUnavailable {
		t.Errorf("/readyz while stopping: %d", rec.status)
	}
}

type recorder struct {
	header http.Header
	status int
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *recorder) WriteHeader(code int)        { r.status = code }

// TestRunConfigErrors runs the whole service with bad settings: each stops
// the start with a *ConfigError naming the variable, before anything
// listens.
func TestRunConfigErrors(t *testing.T) {
	badPolicy := writePolicyFile(t, `{"policies": [{"name": "x", "algorithm": "gcra", "limit": 0, "window": "10s"}], `+routesDefault+`}`)
	unknownAlg := writePolicyFile(t, `{"policies": [{"name": "x", "algorithm": "fixed_window", "limit": 5, "window": "10s"}], `+routesDefault+`}`)
	tests := []struct {
		env     map[string]string
		wantVar string
	}{
		{map[string]string{"RL_REDIS_TIMEOUT": "abc"}, "RL_REDIS_TIMEOUT"},
		{map[string]string{"RL_EXPECTED_INSTANCES": "-1"}, "RL_EXPECTED_INSTANCES"},
		{map[string]string{"RL_POLICY_FILE": badPolicy}, "RL_POLICY_FILE"},
		{map[string]string{"RL_POLICY_FILE": unknownAlg}, "RL_POLICY_FILE"},
	}
	for _, tt := range tests {
		t.Run(tt.wantVar, func(t *testing.T) {
			env := map[string]string{"RL_INSTANCE": "t", "RL_LISTEN_ADDR": "127.0.0.1:0", "RL_ADMIN_ADDR": "127.0.0.1:0"}
			for k, v := range tt.env {
				env[k] = v
			}
			stdout := &syncBuffer{}
			err := Run(context.Background(), envOf(env), stdout, io.Discard)
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Var != tt.wantVar || !strings.HasPrefix(err.Error(), tt.wantVar+": ") {
				t.Errorf("error = %v, want a ConfigError for %s", err, tt.wantVar)
			}
		})
	}
}

func TestListenError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = Run(context.Background(), envOf(map[string]string{
		"RL_INSTANCE": "t", "RL_LISTEN_ADDR": ln.Addr().String(), "RL_ADMIN_ADDR": "127.0.0.1:0",
	}), io.Discard, io.Discard)
	var ce *ConfigError
	if err == nil || errors.As(err, &ce) || !strings.Contains(err.Error(), "RL_LISTEN_ADDR") {
		t.Errorf("error = %v, want a listen error naming RL_LISTEN_ADDR", err)
	}
}

func ExampleRun() {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	env := map[string]string{"RL_INSTANCE": "demo", "RL_LISTEN_ADDR": "127.0.0.1:0", "RL_ADMIN_ADDR": "127.0.0.1:0"}
	err := Run(ctx, func(k string) string { return env[k] }, io.Discard, io.Discard)
	fmt.Println(err)
	// Output: <nil>
}
