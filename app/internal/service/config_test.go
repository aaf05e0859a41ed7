package service

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// envOf returns a getenv over a fixed map.
func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestLoadConfigDefaults(t *testing.T) {
	cfg, err := LoadConfig(envOf(map[string]string{"RL_INSTANCE": "app1"}))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Instance:          "app1",
		ListenAddr:        ":8080",
		AdminAddr:         "127.0.0.1:9090",
		RedisTimeout:      50 * time.Millisecond,
		RedisPoolSize:     64,
		RedisPipelines:    4,
		ReplayTimeout:     2 * time.Second,
		LateWindow:        5 * time.Second,
		ExpectedInstances: 1,
		TrustedProxies:    []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")},
		JournalDir:        "./journal-app1",
		JournalMax:        250_000,
		KeyCapacity:       100000,
		BreakerFailures:   3,
		ProbeInterval:     time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		HeartbeatTTL:      300 * time.Millisecond,
		LeaseGrace:        30 * time.Second,
		ResendWindow:      3 * time.Second,
	}
	cfg.Policies = PolicySet{}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config = %+v\nwant     %+v", cfg, want)
	}
	if cfg.RedisEnabled() {
		t.Error("Redis enabled without RL_REDIS_URL or RL_REDIS_ADDRS")
	}
}

func TestLoadConfigValues(t *testing.T) {
	cfg, err := LoadConfig(envOf(map[string]string{
		"RL_INSTANCE":           "app2",
		"RL_REDIS_ADDRS":        "10.0.0.1:6379,10.0.0.2:6379",
		"RL_REDIS_TIMEOUT":      "100ms",
		"RL_REDIS_POOL_SIZE":    "8",
		"RL_EXPECTED_INSTANCES": "4",
		"RL_DEBUG_HEADERS":      "true",
		"RL_TRUSTED_PROXIES":    "172.16.0.0/12,10.1.2.3/8",
		"RL_LOG_LEVEL":          "debug",
		"RL_JOURNAL_DIR":        "/var/lib/rl",
		"RL_TRUST_REQUEST_ID":   "true",
		"RL_RESEND_WINDOW":      "2s",
		"RL_DEMO":               "true",
		"RL_API_KEY_SECRET":     DemoAPIKeySecret, // allowed in demo mode
		"RL_PPROF":              "true",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.RedisEnabled() || len(cfg.RedisAddrs) != 2 || cfg.RedisTimeout != 100*time.Millisecond ||
		cfg.RedisPoolSize != 8 || cfg.ExpectedInstances != 4 || !cfg.DebugHeaders || cfg.JournalDir != "/var/lib/rl" ||
		cfg.LogLevel.String() != "DEBUG" || !cfg.TrustRequestID || cfg.ResendWindow != 2*time.Second || !cfg.Demo ||
		cfg.APIKeys == nil || !cfg.Pprof {
		t.Errorf("config = %+v", cfg)
	}
	if got := cfg.TrustedProxies[1]; got != netip.MustParsePrefix("10.0.0.0/8") {
		t.Errorf("trusted proxy not masked: %v", got)
	}
	if cfg.Instance == "" {
		t.Error("no instance name")
	}
}

func TestLoadConfigHostnameDefault(t *testing.T) {
	host, err := os.Hostname()
	if err != nil || ratelimit.ValidateName(host) != nil {
		t.Skip("hostname unusable as an instance name")
	}
	cfg, err := LoadConfig(envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Instance != host {
		t.Errorf("instance = %q, want the hostname %q", cfg.Instance, host)
	}
}

func writePolicyFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policies.json")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const routesDefault = `"routes": [{"pattern": "/api/*", "policies": ["x"]}]`

func TestLoadConfigErrors(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		policy  string // policy file body, written to RL_POLICY_FILE
		wantVar string
		wantMsg string // the whole message starts with this
		secret  string // must not appear in the message
	}{
		{"bad duration", map[string]string{"RL_REDIS_TIMEOUT": "abc"}, "", "RL_REDIS_TIMEOUT",
			`RL_REDIS_TIMEOUT: time: invalid duration "abc"`, ""},
		{"zero timeout", map[string]string{"RL_REDIS_TIMEOUT": "0s"}, "", "RL_REDIS_TIMEOUT", "RL_REDIS_TIMEOUT: must be", ""},
		{"replay timeout below the call timeout", map[string]string{"RL_REPLAY_TIMEOUT": "10ms"}, "", "RL_REPLAY_TIMEOUT", "RL_REPLAY_TIMEOUT: must be between", ""},
		{"negative instances", map[string]string{"RL_EXPECTED_INSTANCES": "-1"}, "", "RL_EXPECTED_INSTANCES",
			"RL_EXPECTED_INSTANCES: must be at least 1, got -1", ""},
		{"non-numeric instances", map[string]string{"RL_EXPECTED_INSTANCES": "four"}, "", "RL_EXPECTED_INSTANCES",
			"RL_EXPECTED_INSTANCES: strconv.ParseInt", ""},
		{"pool size", map[string]string{"RL_REDIS_POOL_SIZE": "0"}, "", "RL_REDIS_POOL_SIZE", "RL_REDIS_POOL_SIZE: must be at least 1", ""},
		{"pipelines", map[string]string{"RL_REDIS_PIPELINES": "-1"}, "", "RL_REDIS_PIPELINES", "RL_REDIS_PIPELINES: must be 0 (off) or more", ""},
		{"key capacity", map[string]string{"RL_KEY_CAPACITY": "-5"}, "", "RL_KEY_CAPACITY", "RL_KEY_CAPACITY: must be at least 1", ""},
		{"bool", map[string]string{"RL_DEBUG_HEADERS": "maybe"}, "", "RL_DEBUG_HEADERS", "RL_DEBUG_HEADERS: strconv.ParseBool", ""},
		{"trusted proxies", map[string]string{"RL_TRUSTED_PROXIES": "10.0.0.0/8,localhost"}, "", "RL_TRUSTED_PROXIES",
			`RL_TRUSTED_PROXIES: netip.ParsePrefix("localhost")`, ""},
		{"log level", map[string]string{"RL_LOG_LEVEL": "loud"}, "", "RL_LOG_LEVEL", "RL_LOG_LEVEL: slog: level string", ""},
		{"instance name", map[string]string{"RL_INSTANCE": "app 1"}, "", "RL_INSTANCE", "RL_INSTANCE: ", ""},
		{"same ports", map[string]string{"RL_LISTEN_ADDR": ":8000", "RL_ADMIN_ADDR": ":8000"}, "", "RL_ADMIN_ADDR", "RL_ADMIN_ADDR: must differ", ""},
		{"short admin token", map[string]string{"RL_ADMIN_TOKEN": "0123456789abcdef0123456789abcdef,hunter2"}, "", "RL_ADMIN_TOKEN",
			"RL_ADMIN_TOKEN: token 2 is 7 bytes, want at least 32", "hunter2"},
		{"open admin port without a token", map[string]string{"RL_ADMIN_ADDR": ":9099"}, "", "RL_ADMIN_TOKEN",
			"RL_ADMIN_TOKEN: required: RL_ADMIN_ADDR :9099 is not a loopback address", ""},
		{"URL scheme", map[string]string{"RL_REDIS_URL": "http://u:hunter2@localhost:6379"}, "", "RL_REDIS_URL",
			"RL_REDIS_URL: redis: invalid URL scheme", "hunter2"},
		{"URL syntax hides the password", map[string]string{"RL_REDIS_URL": "redis://u:hunter2@local host:6379"}, "", "RL_REDIS_URL",
			"RL_REDIS_URL: ", "hunter2"},
		{"URL and addresses", map[string]string{"RL_REDIS_URL": "redis://localhost:6379", "RL_REDIS_ADDRS": "localhost:6379"}, "",
			"RL_REDIS_URL", "RL_REDIS_URL: set either", ""},
		{"address without port", map[string]string{"RL_REDIS_ADDRS": "localhost"}, "", "RL_REDIS_ADDRS", `RL_REDIS_ADDRS: "localhost"`, ""},
		{"master without sentinels", map[string]string{"RL_REDIS_MASTER_NAME": "mymaster"}, "", "RL_REDIS_MASTER_NAME",
			"RL_REDIS_MASTER_NAME: needs", ""},
		{"missing policy file", map[string]string{"RL_POLICY_FILE": "/nonexistent/policies.json"}, "", "RL_POLICY_FILE",
			"RL_POLICY_FILE: open /nonexistent/policies.json", ""},
		{"limit 0", nil, `{"policies": [{"name": "x", "algorithm": "gcra", "limit": 0, "window": "10s"}], ` + routesDefault + `}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: policy "x": limit must be between 1 and`, ""},
		{"unknown algorithm", nil, `{"policies": [{"name": "x", "algorithm": "leaky_bucket", "limit": 5, "window": "10s"}], ` + routesDefault + `}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: policy "x": algorithm must be token_bucket, sliding_window_log, sliding_window_counter or gcra, got "leaky_bucket"`, ""},
		{"bad window", nil, `{"policies": [{"name": "x", "algorithm": "gcra", "limit": 5, "window": "10"}], ` + routesDefault + `}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: policy "x": window must be a duration such as "10s": time: missing unit`, ""},
		{"burst on a window algorithm", nil, `{"policies": [{"name": "x", "algorithm": "sliding_window_log", "limit": 5, "burst": 9, "window": "1s"}], ` + routesDefault + `}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: policy "x": burst applies only`, ""},
		{"bad failure mode", nil, `{"policies": [{"name": "x", "algorithm": "gcra", "limit": 5, "window": "1s", "failure_mode": "panic"}], ` + routesDefault + `}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: policy "x": failure_mode must be`, ""},
		{"misspelt field", nil, `{"policies": [{"name": "x", "algorithm": "gcra", "limt": 5, "window": "1s"}], ` + routesDefault + `}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: invalid JSON: json: unknown field "limt"`, ""},
		{"duplicate policy", nil, `{"policies": [{"name": "x", "algorithm": "gcra", "limit": 5, "window": "1s"}, {"name": "x", "algorithm": "gcra", "limit": 5, "window": "1s"}], ` + routesDefault + `}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: policy "x": defined twice`, ""},
		{"route to unknown policy", nil, `{"policies": [{"name": "x", "algorithm": "gcra", "limit": 5, "window": "1s"}], "routes": [{"pattern": "/api/*", "policies": ["y"]}]}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: route "/api/*": unknown policy "y"`, ""},
		{"route pattern", nil, `{"policies": [{"name": "x", "algorithm": "gcra", "limit": 5, "window": "1s"}], "routes": [{"pattern": "/api/{id}", "policies": ["x"]}]}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: route "/api/{id}": pattern parameters`, ""},
		{"route without a policy list", nil, `{"policies": [{"name": "x", "algorithm": "gcra", "limit": 5, "window": "1s"}], "routes": [{"pattern": "/api/*"}]}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: route "/api/*": no policies (write "policies": [] for a route served without limits)`, ""},
		{"no routes", nil, `{"policies": [{"name": "x", "algorithm": "gcra", "limit": 5, "window": "1s"}]}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: no routes`, ""},
		{"not JSON", nil, `policies: []`, "RL_POLICY_FILE", `RL_POLICY_FILE: invalid JSON`, ""},
		{"per what", nil, `{"policies": [{"name": "x", "algorithm": "gcra", "limit": 5, "window": "1s", "per": "user"}], ` + routesDefault + `}`,
			"RL_POLICY_FILE", `RL_POLICY_FILE: policy "x": per must be "key" or "address", got "user"`, ""},
		{"short API key secret", map[string]string{"RL_API_KEY_SECRET": "long-enough-secret-1,hunter2"}, "", "RL_API_KEY_SECRET",
			"RL_API_KEY_SECRET: apikey: new verifier: secret 1: apikey: secret shorter than 16 bytes", "hunter2"},
		{"the published demo secret", map[string]string{"RL_API_KEY_SECRET": DemoAPIKeySecret}, "", "RL_API_KEY_SECRET",
			"RL_API_KEY_SECRET: is the published demo secret", DemoAPIKeySecret},
		{"the demo secret beside another", map[string]string{"RL_API_KEY_SECRET": "long-enough-secret-1," + DemoAPIKeySecret, "RL_DEMO": "false"}, "",
			"RL_API_KEY_SECRET", "RL_API_KEY_SECRET: is the published demo secret", ""},
		{"resend window", map[string]string{"RL_RESEND_WINDOW": "2h"}, "", "RL_RESEND_WINDOW", "RL_RESEND_WINDOW: must be between 1ms and 1m", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"RL_INSTANCE": "app1"}
			for k, v := range tt.env {
				env[k] = v
			}
			if tt.policy != "" {
				env["RL_POLICY_FILE"] = writePolicyFile(t, tt.policy)
			}
			_, err := LoadConfig(envOf(env))
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error = %v, want a *ConfigError", err)
			}
			if ce.Var != tt.wantVar {
				t.Errorf("Var = %q, want %q", ce.Var, tt.wantVar)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, tt.wantMsg) || strings.Contains(msg, "\n") {
				t.Errorf("message = %q, want it to start with %q", msg, tt.wantMsg)
			}
			if tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
				t.Errorf("message leaks %q: %q", tt.secret, err)
			}
		})
	}
}

func TestDefaultPolicies(t *testing.T) {
	set, err := LoadPolicies("")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		alg    ratelimit.Algorithm
		policy string
		limit  int64
		lease  time.Duration
	}{
		"/api/token-bucket":           {ratelimit.TokenBucket, "token-bucket", 100, 0},
		"/api/sliding-window-log":     {ratelimit.SlidingWindowLog, "sliding-window-log", 100, 0},
		"/api/sliding-window-counter": {ratelimit.SlidingWindowCounter, "sliding-window-counter", 100, 0},
		"/api/gcra":                   {ratelimit.GCRA, "gcra", 100, 0},
		"/api/lease-gcra":             {ratelimit.GCRA, "lease-gcra", 300, 2 * time.Second},
		"/api/*":                      {ratelimit.SlidingWindowCounter, "default", 100, 0},
	}
	if len(set.Routes) != len(want) {
		t.Fatalf("%d routes, want %d", len(set.Routes), len(want))
	}
	if !slices.Equal(set.PerAddress, []string{"per-address"}) {
		t.Errorf("per-address policies %v, want [per-address]", set.PerAddress)
	}
	for _, r := range set.Routes {
		w, ok := want[r.Pattern]
		if !ok || len(r.Policies) != 2 {
			t.Errorf("unexpected route %+v", r)
			continue
		}
		p := r.Policies[0]
		if p.Name != w.policy || p.Algorithm != w.alg || p.Limit != w.limit || p.Window != 10*time.Second || p.Capacity() != w.limit || p.Lease != w.lease {
			t.Errorf("route %s: policy %+v", r.Pattern, p)
		}
		// The documented ceiling: every route, at most 10× a key's quota.
		if c := r.Policies[1]; c.Name != "per-address" || c.Capacity() > 10*p.Capacity() || c.Window != p.Window {
			t.Errorf("route %s: ceiling %+v", r.Pattern, c)
		}
	}
}

func TestParsePoliciesFull(t *testing.T) {
	set, err := ParsePolicies([]byte(`{
	  "policies": [
	    {"name": "login", "algorithm": "token-bucket", "limit": 5, "window": "1m", "burst": 10,
	     "failure_mode": "closed", "fallback_factor": 0.5, "shadow": true},
	    {"name": "per-ip", "algorithm": "gcra", "limit": 1000, "window": "1h", "lease": "250ms"}
	  ],
	  "routes": [{"pattern": "/api/login", "policies": ["login", "per-ip"]}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	want := ratelimit.Policy{Name: "login", Algorithm: ratelimit.TokenBucket, Limit: 5, Window: time.Minute, Burst: 10,
		FailureMode: ratelimit.ModeClosed, FallbackFactor: 0.5, Shadow: true}
	if got := set.Routes[0].Policies; len(got) != 2 || got[0] != want || got[1].Name != "per-ip" || got[1].Lease != 250*time.Millisecond {
		t.Errorf("route policies = %+v", got)
	}
}

// TestFailureModesAreDecisionModes: each failure_mode of the policy file is
// the mode that then decides (X-RateLimit-Mode): fallback the local share,
// open and closed themselves; none is the default (the local share).
func TestFailureModesAreDecisionModes(t *testing.T) {
	for file, want := range map[string]ratelimit.Mode{
		"":         "",
		"fallback": ratelimit.ModeLocal,
		"open":     ratelimit.ModeOpen,
		"closed":   ratelimit.ModeClosed,
	} {
		set, err := ParsePolicies([]byte(`{"policies": [{"name": "p", "algorithm": "gcra", "limit": 5, "window": "1s", "failure_mode": "` +
			file + `"}], "routes": [{"pattern": "/api/p", "policies": ["p"]}]}`))
		if err != nil {
			t.Fatalf("failure_mode %q: %v", file, err)
		}
		if got := set.Routes[0].Policies[0].FailureMode; got != want {
			t.Errorf("failure_mode %q: FailureMode %q, want %q", file, got, want)
		}
	}
}

// TestBadLeaseNamesTheField: a lease on another algorithm than gcra, one
// longer than a quarter of the refill time, or not a duration fails the
// load with the policy and the field named.
func TestBadLeaseNamesTheField(t *testing.T) {
	for _, c := range []struct{ policy, want string }{
		{`{"name": "p", "algorithm": "token_bucket", "limit": 100, "window": "10s", "lease": "1s"}`, "lease applies only to gcra"},
		{`{"name": "p", "algorithm": "gcra", "limit": 100, "window": "10s", "lease": "3s"}`, "lease must be between 1ms and a quarter"},
		{`{"name": "p", "algorithm": "gcra", "limit": 100, "window": "10s", "lease": "soon"}`, "lease must be a duration"},
	} {
		_, err := ParsePolicies([]byte(`{"policies": [` + c.policy + `], "routes": [{"pattern": "/a", "policies": ["p"]}]}`))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"p"`) {
			t.Errorf("%s: %v; want an error naming policy \"p\" and %q", c.policy, err, c.want)
		}
	}
}

// TestSmallPoolKeepsTheDefaultPipelines: a pool smaller than the default
// pipelines in flight is a valid setting (the store uses at most one
// pipeline per connection), not a start-up error about a variable the
// operator did not set.
func TestSmallPoolKeepsTheDefaultPipelines(t *testing.T) {
	cfg, err := LoadConfig(envOf(map[string]string{"RL_INSTANCE": "app1", "RL_REDIS_POOL_SIZE": "2"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RedisPoolSize != 2 || cfg.RedisPipelines != 4 {
		t.Errorf("pool %d, pipelines %d", cfg.RedisPoolSize, cfg.RedisPipelines)
	}
}
