package service

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/internal/envoyrls"
	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
)

// Config is the service's settings, read from the environment (see
// README.md, "Configuration"; the env tags are the variable names). Build it with
// LoadConfig, which fills the defaults and validates.
type Config struct {
	// Instance names this instance in X-Served-By, logs, heartbeats and the
	// journal. Default: the hostname.
	Instance   string `env:"RL_INSTANCE"`
	ListenAddr string `env:"RL_LISTEN_ADDR" envDefault:":8080"`
	// AdminAddr serves /metrics, /status and POST /admin/reset: loopback
	// unless set (the compose stack sets :9090 for nginx's network and
	// Prometheus).
	AdminAddr string `env:"RL_ADMIN_ADDR" envDefault:"127.0.0.1:9090"`
	// AdminTokens are the bearer tokens every /admin/* and /debug/*
	// request must carry (RL_ADMIN_TOKEN, comma-separated so that a new
	// one can be added before the old one goes; each at least 32 bytes).
	// Without one the admin port must be loopback, unless Demo (admin.go).
	AdminTokens []string `env:"RL_ADMIN_TOKEN" envSeparator:","`

	// RedisURL and RedisAddrs select the shared store; both empty: memory
	// mode (one instance, no Redis).
	RedisURL        string        `env:"RL_REDIS_URL"`
	RedisAddrs      []string      `env:"RL_REDIS_ADDRS" envSeparator:","`
	RedisMasterName string        `env:"RL_REDIS_MASTER_NAME"`
	RedisUsername   string        `env:"RL_REDIS_USERNAME"`
	RedisPassword   string        `env:"RL_REDIS_PASSWORD"`
	RedisTimeout    time.Duration `env:"RL_REDIS_TIMEOUT" envDefault:"50ms"`
	RedisPoolSize   int           `env:"RL_REDIS_POOL_SIZE" envDefault:"64"`
	// RedisPipelines is how many pipelines of concurrent decisions may be
	// in flight at once; decisions that arrive meanwhile wait for the next
	// one (redisstore.Config.Coalescing). A lone decision leaves at once. A
	// shared pipeline is bounded by the latest deadline of its calls, each
	// of which stops waiting at its own. 0: one round trip per decision.
	// At most RedisPoolSize are in flight (one connection each).
	RedisPipelines int `env:"RL_REDIS_PIPELINES" envDefault:"4"`
	// RedisTLS turns TLS on for RL_REDIS_ADDRS: every Cluster node, every
	// Sentinel and the master it names. A rediss:// URL turns it on for
	// RL_REDIS_URL. The files and the server name apply to both; without a
	// CA file the system's roots verify the server (redistls.go).
	RedisTLS           bool   `env:"RL_REDIS_TLS" envDefault:"false"`
	RedisTLSCAFile     string `env:"RL_REDIS_TLS_CA_FILE"`
	RedisTLSCertFile   string `env:"RL_REDIS_TLS_CERT_FILE"`
	RedisTLSKeyFile    string `env:"RL_REDIS_TLS_KEY_FILE"`
	RedisTLSServerName string `env:"RL_REDIS_TLS_SERVER_NAME"`
	// ReplayTimeout bounds one replay or restore pipeline, on a client of
	// its own (the decisions' timeout would cut a pipeline of 1000 keys).
	ReplayTimeout time.Duration `env:"RL_REPLAY_TIMEOUT" envDefault:"2s"`
	// LateWindow is how long a decision's reply is still read after its
	// deadline, so that what Redis decided is not lost (resilient.Config
	// .LateWindow): the request was decided locally meanwhile, and its
	// grant waits for the reply before it is replayed.
	LateWindow time.Duration `env:"RL_LATE_WINDOW" envDefault:"5s"`

	// ExpectedInstances is the fleet size assumed until the first
	// heartbeat is read (used by the resilient limiter).
	ExpectedInstances int `env:"RL_EXPECTED_INSTANCES" envDefault:"1"`
	// PolicyFile is a JSON policy file; empty: the embedded default.
	PolicyFile     string         `env:"RL_POLICY_FILE"`
	DebugHeaders   bool           `env:"RL_DEBUG_HEADERS" envDefault:"false"`
	TrustedProxies []netip.Prefix `env:"RL_TRUSTED_PROXIES" envSeparator:"," envDefault:"127.0.0.1/32,::1/128"`
	// APIKeySecrets sign and check API keys (package apikey): the first
	// signs, all are accepted (rotation). None: every X-API-Key is
	// refused with 401, and clients are limited per address.
	APIKeySecrets []string `env:"RL_API_KEY_SECRET" envSeparator:","`
	// APIKeys checks keys; built from APIKeySecrets.
	APIKeys *apikey.Verifier `env:"-"`
	// JournalDir is the fallback journal's directory. Default:
	// ./journal-<instance>.
	JournalDir string `env:"RL_JOURNAL_DIR"`
	// JournalMax bounds the grants journaled during an outage.
	JournalMax  int `env:"RL_JOURNAL_MAX" envDefault:"250000"`
	KeyCapacity int `env:"RL_KEY_CAPACITY" envDefault:"100000"`

	// The circuit breaker and the fleet heartbeats (resilient limiter).
	BreakerFailures   int           `env:"RL_BREAKER_FAILURES" envDefault:"3"`
	ProbeInterval     time.Duration `env:"RL_PROBE_INTERVAL" envDefault:"1s"`
	HeartbeatInterval time.Duration `env:"RL_HEARTBEAT_INTERVAL" envDefault:"100ms"`
	HeartbeatTTL      time.Duration `env:"RL_HEARTBEAT_TTL" envDefault:"300ms"`
	LeaseGrace        time.Duration `env:"RL_LEASE_GRACE" envDefault:"30s"`

	LogLevel slog.Level `env:"RL_LOG_LEVEL" envDefault:"info"`

	// Guards (guard.go). TrustRequestID takes X-Request-Id from
	// RL_TRUSTED_PROXIES as the request's id, which the limiter counts once
	// within ResendWindow (a proxy's resend): on only behind a proxy that
	// overwrites the header (nginx does). Demo allows the published demo
	// secret in RL_API_KEY_SECRET; Pprof serves /debug/pprof/ on the admin
	// port.
	TrustRequestID bool          `env:"RL_TRUST_REQUEST_ID" envDefault:"false"`
	ResendWindow   time.Duration `env:"RL_RESEND_WINDOW" envDefault:"3s"`
	Demo           bool          `env:"RL_DEMO" envDefault:"false"`
	Pprof          bool          `env:"RL_PPROF" envDefault:"false"`
	// DebugClock opens POST /debug/clock on the admin port, which moves
	// this instance's wall clock (the chaos suite's clock-step scenario):
	// for the chaos stacks only.
	DebugClock bool `env:"RL_DEBUG_CLOCK" envDefault:"false"`
	// GRPCAddr is where Envoy's rate limit service v3 is served (gRPC,
	// plaintext unless GRPCTLSCertFile); empty: not served. RLSConfigDir is its configuration, a
	// directory of envoyproxy/ratelimit YAML files (required with
	// GRPCAddr); RLSResponseHeaders adds the rate-limit headers to its
	// answers (docs/DOORS.md).
	GRPCAddr           string `env:"RL_GRPC_ADDR"`
	RLSConfigDir       string `env:"RL_RLS_CONFIG_DIR"`
	RLSResponseHeaders bool   `env:"RL_RLS_RESPONSE_HEADERS" envDefault:"false"`
	// GRPCTLSCertFile and GRPCTLSKeyFile serve GRPCAddr over TLS; with
	// GRPCTLSClientCAFile every caller must present a certificate signed
	// by one of its CAs (mTLS) (rlstls.go).
	GRPCTLSCertFile     string `env:"RL_GRPC_TLS_CERT_FILE"`
	GRPCTLSKeyFile      string `env:"RL_GRPC_TLS_KEY_FILE"`
	GRPCTLSClientCAFile string `env:"RL_GRPC_TLS_CLIENT_CA_FILE"`
	// RLS is the loaded RLSConfigDir.
	RLS *envoyrls.Config `env:"-"`
	// RedisTLSConfig is the TLS configuration built from the RL_REDIS_TLS*
	// settings when TLS is on (RL_REDIS_TLS or a rediss:// URL); nil:
	// plaintext.
	// GRPCTLSConfig is the gRPC door's, from the RL_GRPC_TLS* ones; nil:
	// plaintext.
	RedisTLSConfig *tls.Config `env:"-"`
	GRPCTLSConfig  *tls.Config `env:"-"`

	// Policies is the loaded and validated policy file.
	Policies PolicySet `env:"-"`
}

// clash reports whether listening on a and on b would take the same port:
// the same port (not 0) on the same host, or on a host and every interface.
func clash(a, b string) bool {
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil {
		return a == b
	}
	any := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return pa == pb && pa != "0" && (ha == hb || any(ha) || any(hb))
}

// RedisEnabled reports whether a shared store is configured.
func (c Config) RedisEnabled() bool { return c.RedisURL != "" || len(c.RedisAddrs) > 0 }

// ConfigError is a setting that is unusable. Its message names the
// variable: "RL_REDIS_TIMEOUT: time: invalid duration \"abc\"".
type ConfigError struct {
	Var string
	Err error
}

func (e *ConfigError) Error() string { return e.Var + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *ConfigError) Unwrap() error { return e.Err }

func configErr(name string, format string, args ...any) error {
	return &ConfigError{Var: name, Err: fmt.Errorf(format, args...)}
}

// LoadConfig reads the settings through getenv (an empty value counts as
// unset), applies the defaults, loads the policy file and validates
// everything. The first problem is returned as a *ConfigError.
func LoadConfig(getenv func(string) string) (Config, error) {
	var cfg Config
	environ := map[string]string{}
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("env"), ",")
		if name == "" || name == "-" {
			continue
		}
		if v := getenv(name); v != "" {
			environ[name] = v
		}
	}
	parsers := map[reflect.Type]env.ParserFunc{
		// The env package's own parser words its error differently; this
		// keeps time.ParseDuration's message ("time: invalid duration").
		reflect.TypeFor[time.Duration](): func(v string) (any, error) { return time.ParseDuration(v) },
	}
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: environ, FuncMap: parsers}); err != nil {
		return Config{}, envError(t, err)
	}
	if err := cfg.validate(); err != nil {
		return Config{}, err
	}
	policies, err := LoadPolicies(cfg.PolicyFile)
	if err != nil {
		return Config{}, &ConfigError{Var: "RL_POLICY_FILE", Err: err}
	}
	cfg.Policies = policies
	if cfg.GRPCAddr != "" {
		if cfg.RLSConfigDir == "" {
			return Config{}, configErr("RL_RLS_CONFIG_DIR", "needed with RL_GRPC_ADDR: a directory of envoyproxy/ratelimit configuration files")
		}
		if cfg.RLS, err = envoyrls.Load(cfg.RLSConfigDir); err != nil {
			return Config{}, &ConfigError{Var: "RL_RLS_CONFIG_DIR", Err: err}
		}
	}
	return cfg, nil
}

// envError turns the env package's first error into a ConfigError naming
// the variable instead of the struct field.
func envError(t reflect.Type, err error) error {
	var pe env.ParseError
	if errors.As(err, &pe) {
		name := pe.Name
		if f, ok := t.FieldByName(pe.Name); ok {
			name, _, _ = strings.Cut(f.Tag.Get("env"), ",")
		}
		return &ConfigError{Var: name, Err: pe.Err}
	}
	return &ConfigError{Var: "environment", Err: err}
}

// validate checks the values the env package parsed and fills the computed
// defaults.
func (c *Config) validate() error {
	if c.Instance == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			return configErr("RL_INSTANCE", "not set and the hostname is unknown")
		}
		c.Instance = host
	}
	if err := ratelimit.ValidateName(c.Instance); err != nil {
		return configErr("RL_INSTANCE", "%w", err)
	}
	if clash(c.ListenAddr, c.AdminAddr) {
		return configErr("RL_ADMIN_ADDR", "must differ from RL_LISTEN_ADDR (%s)", c.ListenAddr)
	}
	if c.GRPCAddr != "" && (clash(c.GRPCAddr, c.ListenAddr) || clash(c.GRPCAddr, c.AdminAddr)) {
		return configErr("RL_GRPC_ADDR", "must differ from RL_LISTEN_ADDR (%s) and RL_ADMIN_ADDR (%s)", c.ListenAddr, c.AdminAddr)
	}
	if c.RedisURL != "" {
		if len(c.RedisAddrs) > 0 {
			return configErr("RL_REDIS_URL", "set either RL_REDIS_URL or RL_REDIS_ADDRS, not both")
		}
		if _, err := redis.ParseURL(c.RedisURL); err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // url.Error repeats the URL, password included
			}
			return configErr("RL_REDIS_URL", "%w (want redis://[user:pass@]host:port/db)", err)
		}
	}
	for _, a := range c.RedisAddrs {
		if strings.TrimSpace(a) == "" || !strings.Contains(a, ":") {
			return configErr("RL_REDIS_ADDRS", "%q is not host:port", a)
		}
	}
	if c.RedisMasterName != "" && len(c.RedisAddrs) == 0 {
		return configErr("RL_REDIS_MASTER_NAME", "needs the Sentinel addresses in RL_REDIS_ADDRS")
	}
	if c.RedisTimeout <= 0 || c.RedisTimeout > time.Minute {
		return configErr("RL_REDIS_TIMEOUT", "must be between 1ns and 1m, got %v", c.RedisTimeout)
	}
	if c.LateWindow < 0 || c.LateWindow > 10*time.Minute {
		return configErr("RL_LATE_WINDOW", "must be between 0 and 10m, got %v", c.LateWindow)
	}
	if c.ReplayTimeout < c.RedisTimeout || c.ReplayTimeout > 10*time.Minute {
		return configErr("RL_REPLAY_TIMEOUT", "must be between RL_REDIS_TIMEOUT (%v) and 10m, got %v", c.RedisTimeout, c.ReplayTimeout)
	}
	if c.RedisPoolSize < 1 {
		return configErr("RL_REDIS_POOL_SIZE", "must be at least 1, got %d", c.RedisPoolSize)
	}
	if c.RedisPipelines < 0 {
		return configErr("RL_REDIS_PIPELINES", "must be 0 (off) or more, got %d", c.RedisPipelines)
	}
	if err := c.validateRedisTLS(); err != nil {
		return err
	}
	if err := c.validateGRPCTLS(); err != nil {
		return err
	}
	if c.ExpectedInstances < 1 {
		return configErr("RL_EXPECTED_INSTANCES", "must be at least 1, got %d", c.ExpectedInstances)
	}
	if c.KeyCapacity < 1 {
		return configErr("RL_KEY_CAPACITY", "must be at least 1, got %d", c.KeyCapacity)
	}
	if c.JournalMax < 1 {
		return configErr("RL_JOURNAL_MAX", "must be at least 1, got %d", c.JournalMax)
	}
	if c.BreakerFailures < 1 {
		return configErr("RL_BREAKER_FAILURES", "must be at least 1, got %d", c.BreakerFailures)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"RL_PROBE_INTERVAL", c.ProbeInterval}, {"RL_HEARTBEAT_INTERVAL", c.HeartbeatInterval}, {"RL_HEARTBEAT_TTL", c.HeartbeatTTL}, {"RL_LEASE_GRACE", c.LeaseGrace}} {
		if d.v <= 0 || d.v > time.Hour {
			return configErr(d.name, "must be between 1ns and 1h, got %v", d.v)
		}
	}
	if c.HeartbeatTTL <= c.HeartbeatInterval {
		return configErr("RL_HEARTBEAT_TTL", "must exceed RL_HEARTBEAT_INTERVAL (%v), got %v", c.HeartbeatInterval, c.HeartbeatTTL)
	}
	for i, p := range c.TrustedProxies {
		c.TrustedProxies[i] = p.Masked()
	}
	if c.JournalDir == "" {
		c.JournalDir = "./journal-" + c.Instance
	}
	if err := c.validateGuards(); err != nil {
		return err
	}
	if len(c.APIKeySecrets) > 0 {
		v, err := apikey.NewVerifier(c.APIKeySecrets...)
		if err != nil {
			return configErr("RL_API_KEY_SECRET", "%w (comma-separated secrets of at least %d bytes each)", err, apikey.MinSecretBytes)
		}
		c.APIKeys = v
	}
	return nil
}
