package native

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Topology is the Redis deployment the stack runs (LOCAL_TOPOLOGY).
type Topology string

// The topologies.
const (
	Single   Topology = "single"
	Sentinel Topology = "sentinel"
	Cluster  Topology = "cluster"
)

// Settings are the native stack's settings, one field per environment
// variable (Help lists them). The zero value is not usable: get one from
// Load or LoadSaved. Paths are absolute.
type Settings struct {
	RunDir   string // LOCAL_RUN_DIR
	Topology Topology
	Host     string

	NginxPort        int
	RedisPort        int
	SentinelPortBase int
	ProxyAPIPort     int
	AppPortBase      int
	AdminPortBase    int
	ViaPortBase      int
	StaticPort       int
	RLSPort          int
	GRPCPortBase     int
	PrometheusPort   int

	RedisPassword string
	APIKeySecret  string
	AdminToken    string
	Demo          bool // RL_DEMO of the apps
	DebugClock    bool // RL_DEBUG_CLOCK of the apps

	PolicyFile         string
	PolicyDir          string
	RLSConfigDir       string
	RLSConfigPerAppDir string

	ReadyTimeout time.Duration
	StopTimeout  time.Duration
	RedisTimeout time.Duration
	LogLevel     string
	GOMAXPROCS   int
	RedisDirect  bool
	// Prometheus is LOCAL_PROMETHEUS resolved: auto is true when
	// prometheus is installed.
	Prometheus bool
	SkipBuild  bool
}

// variable is one environment variable of the settings.
type variable struct {
	Name    string
	Default string // as documented; some are computed (Doc says how)
	Doc     string
	// Saved: in stack.env, so that what acts on a running stack uses the
	// value its up had.
	Saved bool
	// computed: set works the default out itself from "" (Default
	// describes it).
	computed bool
	set      func(s *Settings, v string, c *loader) error
	get      func(s *Settings) string
}

// variables are the settings' environment variables, in the order Help
// lists them and stack.env holds them.
var variables = []variable{
	{Name: "LOCAL_TOPOLOGY", Default: "single", Saved: true,
		Doc: "single, sentinel (a master, its replica, three Sentinels) or cluster (3 masters with a replica each)",
		set: func(s *Settings, v string, _ *loader) error {
			switch t := Topology(v); t {
			case Single, Sentinel, Cluster:
				s.Topology = t
				return nil
			}
			return errors.New("want single, sentinel or cluster")
		},
		get: func(s *Settings) string { return string(s.Topology) }},
	{Name: "LOCAL_HOST", Default: "127.0.0.1", Saved: true,
		Doc: "the address everything listens on (an IPv4 address in the sentinel and cluster topologies)",
		set: func(s *Settings, v string, _ *loader) error { s.Host = v; return nil },
		get: func(s *Settings) string { return s.Host }},
	portVar("LOCAL_NGINX_PORT", "8080", "nginx", func(s *Settings) *int { return &s.NginxPort }),
	portVar("LOCAL_REDIS_PORT", "6390", "redis; the other data nodes on the next ports", func(s *Settings) *int { return &s.RedisPort }),
	portVar("LOCAL_SENTINEL_PORT_BASE", "26390", "sentinelN on base+N-1", func(s *Settings) *int { return &s.SentinelPortBase }),
	portVar("LOCAL_PROXY_API_PORT", "8474", "toxiproxy's API", func(s *Settings) *int { return &s.ProxyAPIPort }),
	portVar("LOCAL_APP_PORT_BASE", "8080", "appN on base+N", func(s *Settings) *int { return &s.AppPortBase }),
	portVar("LOCAL_ADMIN_PORT_BASE", "9080", "appN's admin port on base+N", func(s *Settings) *int { return &s.AdminPortBase }),
	portVar("LOCAL_VIA_PORT_BASE", "16390", "the proxy appN-redis on base+N, the proxy replication on base+9", func(s *Settings) *int { return &s.ViaPortBase }),
	portVar("LOCAL_STATIC_PORT", "8070", "the static site", func(s *Settings) *int { return &s.StaticPort }),
	portVar("LOCAL_RLS_PORT", "8090", "nginx's gRPC listener (Envoy's rate limit service, balanced)", func(s *Settings) *int { return &s.RLSPort }),
	portVar("LOCAL_GRPC_PORT_BASE", "7080", "appN's RL_GRPC_ADDR on base+N", func(s *Settings) *int { return &s.GRPCPortBase }),
	portVar("LOCAL_PROMETHEUS_PORT", "9089", "prometheus (off 9090, where a system Prometheus may listen)", func(s *Settings) *int { return &s.PrometheusPort }),
	{Name: "LOCAL_PROMETHEUS", Default: "auto", Saved: true,
		Doc: "auto: start prometheus when it is installed; 1: it must be; 0: never",
		set: func(s *Settings, v string, c *loader) error {
			switch v {
			case "auto":
				_, s.Prometheus = c.lookPath("prometheus")
			case "0", "1":
				s.Prometheus = v == "1"
			default:
				return errors.New("want auto, 1 or 0")
			}
			return nil
		},
		get: func(s *Settings) string { return boolString(s.Prometheus, "1", "0") }},
	{Name: "REDIS_PASSWORD", Default: "requirepass of redis/redis.conf", Saved: true, computed: true,
		Doc: "the data nodes' password",
		set: func(s *Settings, v string, c *loader) error {
			if v == "" {
				v = requirepass(filepath.Join(c.root, "redis", "redis.conf"))
			}
			s.RedisPassword = v
			return nil
		},
		get: func(s *Settings) string { return s.RedisPassword }},
	{Name: "RL_API_KEY_SECRET", Default: "fleetlimit-demo-secret-change-me", Saved: true,
		Doc: "the apps' API-key secret (comma-separated; the first signs); the demo's is accepted in demo mode only",
		set: func(s *Settings, v string, _ *loader) error { s.APIKeySecret = v; return nil },
		get: func(s *Settings) string { return s.APIKeySecret }},
	{Name: "RL_ADMIN_TOKEN", Default: "fleetlimit-demo-admin-token-change-me", Saved: true,
		Doc: "the bearer token of the apps' /admin/* and /debug/* (comma-separated; the first is the one scripts send); the demo's is accepted in demo mode only",
		set: func(s *Settings, v string, _ *loader) error { s.AdminToken = v; return nil },
		get: func(s *Settings) string { return s.AdminToken }},
	boolVar("RL_DEMO", "true", "the apps' demo mode (false, with a secret and a token of your own, leaves it)", func(s *Settings) *bool { return &s.Demo }),
	boolVar("RL_DEBUG_CLOCK", "false", "the apps' POST /debug/clock on the admin port, which moves an instance's wall clock (the chaos suite's clock-step)", func(s *Settings) *bool { return &s.DebugClock }),
	pathVar("LOCAL_POLICY_FILE", "", "a JSON policy file, the apps' RL_POLICY_FILE (relative: to the checkout)", func(s *Settings) *string { return &s.PolicyFile }),
	pathVar("LOCAL_POLICY_DIR", "", "with LOCAL_POLICY_FILE: each app reads its own policy file, <dir>/<app>.json, a copy of LOCAL_POLICY_FILE made when the app starts and the copy is missing (the chaos suite's reload-under-load changes them one app at a time)", func(s *Settings) *string { return &s.PolicyDir }),
	pathVar("LOCAL_RLS_CONFIG_DIR", "envoy/ratelimit", "the apps' RL_RLS_CONFIG_DIR, a directory of envoyproxy/ratelimit YAML files", func(s *Settings) *string { return &s.RLSConfigDir }),
	pathVar("LOCAL_RLS_CONFIG_PER_APP_DIR", "", "each app reads its own RL_RLS_CONFIG_DIR, <dir>/<app>/, laid out as a Kubernetes ConfigMap mount (..data -> ..<timestamp>/, x.yaml -> ..data/x.yaml) with a copy of LOCAL_RLS_CONFIG_DIR's files, made when the app starts and the copy is missing (the chaos suite's reload-under-load swaps ..data one app at a time)", func(s *Settings) *string { return &s.RLSConfigPerAppDir }),
	secondsVar("LOCAL_READY_TIMEOUT", "30", 1, true, "seconds a start waits for its services to be ready", func(s *Settings) *time.Duration { return &s.ReadyTimeout }),
	{Name: "LOCAL_REDIS_TIMEOUT", Default: "50ms", Saved: true,
		Doc: "the apps' RL_REDIS_TIMEOUT",
		set: func(s *Settings, v string, _ *loader) error {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return errors.New("want a positive duration, e.g. 50ms")
			}
			s.RedisTimeout = d
			return nil
		},
		get: func(s *Settings) string { return s.RedisTimeout.String() }},
	{Name: "LOCAL_LOG_LEVEL", Default: "debug", Saved: true,
		Doc: "the apps' RL_LOG_LEVEL (debug logs a line per request)",
		set: func(s *Settings, v string, _ *loader) error {
			var l slog.Level
			if err := l.UnmarshalText([]byte(v)); err != nil {
				return errors.New("want debug, info, warn or error")
			}
			s.LogLevel = v
			return nil
		},
		get: func(s *Settings) string { return s.LogLevel }},
	{Name: "LOCAL_GOMAXPROCS", Default: "the cores / 4, at least 1", Saved: true, computed: true,
		// Five Go processes on a small host, each with one P per core,
		// spend their CPU waking and parking threads against each other
		// (docs/MEASURING.md).
		Doc: "GOMAXPROCS of each app and of toxiproxy",
		set: func(s *Settings, v string, c *loader) error {
			if v == "" {
				s.GOMAXPROCS = max(c.numCPU/4, 1)
				return nil
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return errors.New("want a number, at least 1")
			}
			s.GOMAXPROCS = n
			return nil
		},
		get: func(s *Settings) string { return strconv.Itoa(s.GOMAXPROCS) }},
	{Name: "LOCAL_REDIS_DIRECT", Default: "0", Saved: true,
		Doc: "1: the apps dial Redis itself, not their fault proxy (the chaos suite's partition and latency faults then miss them); single topology only, the others always dial directly",
		set: func(s *Settings, v string, _ *loader) error {
			b, err := zeroOne(v)
			s.RedisDirect = b
			return err
		},
		get: func(s *Settings) string { return boolString(s.RedisDirect, "1", "0") }},
	{Name: "LOCAL_SKIP_BUILD", Default: "0",
		Doc: "1: use bin/ratelimiter and bin/toxiproxy-server (and bin/localstack) as they are",
		set: func(s *Settings, v string, _ *loader) error {
			b, err := zeroOne(v)
			s.SkipBuild = b
			return err
		}},
	secondsVar("LOCAL_STOP_TIMEOUT", "10", 0, false, "seconds a stop waits after TERM before it KILLs", func(s *Settings) *time.Duration { return &s.StopTimeout }),
	{Name: "LOCAL_RUN_DIR", Default: ".run in the checkout", computed: true,
		Doc: "holds the pids, logs, data, stack.env and stack.json, so that a second stack (a test's, on other ports) cannot collide with the usual one; every command for that stack must set it (relative: to the working directory)",
		set: func(s *Settings, v string, c *loader) error {
			s.RunDir = c.runDir(v)
			return nil
		}},
}

func portVar(name, def, doc string, field func(*Settings) *int) variable {
	return variable{Name: name, Default: def, Doc: doc, Saved: true,
		set: func(s *Settings, v string, _ *loader) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 65535 {
				return errors.New("not a port (want 1-65535)")
			}
			*field(s) = n
			return nil
		},
		get: func(s *Settings) string { return strconv.Itoa(*field(s)) }}
}

func boolVar(name, def, doc string, field func(*Settings) *bool) variable {
	return variable{Name: name, Default: def, Doc: doc, Saved: true,
		set: func(s *Settings, v string, _ *loader) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return errors.New("want true or false")
			}
			*field(s) = b
			return nil
		},
		get: func(s *Settings) string { return strconv.FormatBool(*field(s)) }}
}

// pathVar is a file or directory, made absolute against the checkout (the
// scripts used to resolve it there); def is relative to the checkout too.
func pathVar(name, def, doc string, field func(*Settings) *string) variable {
	return variable{Name: name, Default: def, Doc: doc, Saved: true,
		set: func(s *Settings, v string, c *loader) error {
			if v != "" && !filepath.IsAbs(v) {
				v = filepath.Join(c.root, v)
			}
			*field(s) = v
			return nil
		},
		get: func(s *Settings) string { return *field(s) }}
}

func secondsVar(name, def string, least int, saved bool, doc string, field func(*Settings) *time.Duration) variable {
	return variable{Name: name, Default: def, Doc: doc, Saved: saved,
		set: func(s *Settings, v string, _ *loader) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < least {
				return fmt.Errorf("want a whole number of seconds, at least %d", least)
			}
			*field(s) = time.Duration(n) * time.Second
			return nil
		},
		get: func(s *Settings) string { return strconv.Itoa(int(field(s).Seconds())) }}
}

func zeroOne(v string) (bool, error) {
	switch v {
	case "0":
		return false, nil
	case "1":
		return true, nil
	}
	return false, errors.New("want 0 or 1")
}

func boolString(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}

// loader is what Load reads besides the variables.
type loader struct {
	root     string
	wd       string
	lookPath func(string) (string, bool)
	numCPU   int
}

// runDir is LOCAL_RUN_DIR v made absolute against the working directory,
// or the checkout's .run.
func (c *loader) runDir(v string) string {
	if v == "" {
		return filepath.Join(c.root, ".run")
	}
	if !filepath.IsAbs(v) {
		v = filepath.Join(c.wd, v)
	}
	return filepath.Clean(v)
}

// Load returns the settings of a new stack for the checkout at root: each
// variable from getenv (os.Getenv), its default when unset or empty. The
// error names every variable whose value is not one it takes; Validate
// checks the rest (files, ports, combinations) when the stack starts.
func Load(root string, getenv func(string) string) (Settings, error) {
	wd, err := os.Getwd()
	if err != nil {
		return Settings{}, err
	}
	return load(&loader{root: root, wd: wd, lookPath: FindBin, numCPU: runtime.NumCPU()}, getenv)
}

func load(c *loader, getenv func(string) string) (Settings, error) {
	var s Settings
	var errs []error
	for _, v := range variables {
		val := getenv(v.Name)
		if val == "" && !v.computed {
			val = v.Default
		}
		if err := v.set(&s, val, c); err != nil {
			errs = append(errs, fmt.Errorf("%s=%s: %w", v.Name, val, err))
		}
	}
	return s, errors.Join(errs...)
}

// LoadSaved returns the settings of the stack that runs in the run
// directory (LOCAL_RUN_DIR from getenv): those its up saved in stack.env,
// and for the others (LOCAL_SKIP_BUILD, LOCAL_STOP_TIMEOUT) getenv's. The
// error wraps ErrNoStack when there is no stack.env.
func LoadSaved(root string, getenv func(string) string) (Settings, error) {
	wd, err := os.Getwd()
	if err != nil {
		return Settings{}, err
	}
	c := &loader{root: root, wd: wd, lookPath: FindBin, numCPU: runtime.NumCPU()}
	dir := c.runDir(getenv("LOCAL_RUN_DIR"))
	saved, err := readEnvFile(filepath.Join(dir, stackEnv))
	if errors.Is(err, os.ErrNotExist) {
		return Settings{}, fmt.Errorf("%w (%s missing): run make local-up", ErrNoStack, display(root, filepath.Join(dir, stackEnv)))
	}
	if err != nil {
		return Settings{}, err
	}
	return load(c, func(name string) string {
		if v, ok := saved[name]; ok {
			return v
		}
		return getenv(name)
	})
}

// ErrNoStack is LoadSaved's error when no stack is up.
var ErrNoStack = errors.New("no native stack is up")

// RunDir returns the run directory that getenv's LOCAL_RUN_DIR names for
// the checkout at root (.run in it by default).
func RunDir(root string, getenv func(string) string) string {
	wd, _ := os.Getwd()
	return (&loader{root: root, wd: wd}).runDir(getenv("LOCAL_RUN_DIR"))
}

// requirepass returns the requirepass value of a redis.conf, unquoted; ""
// when there is none.
func requirepass(conf string) string {
	b, err := os.ReadFile(conf)
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "requirepass" {
			return strings.TrimSuffix(strings.TrimPrefix(f[1], `"`), `"`)
		}
	}
	return ""
}

var ipv4 = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$`)

// Validate checks what Load cannot on its own: the files and directories
// the settings name, the combinations, and that every port of the
// topology is one. Each error names its variable.
func (s Settings) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Host == "" {
		bad("LOCAL_HOST is empty")
	} else if s.Topology != Single && !ipv4.MatchString(s.Host) {
		// Sentinel (resolve-hostnames no) and the cluster announce
		// addresses, not names.
		bad("LOCAL_TOPOLOGY=%s needs LOCAL_HOST to be an IPv4 address, not %s", s.Topology, s.Host)
	}
	if st, err := os.Stat(s.RLSConfigDir); err != nil || !st.IsDir() {
		bad("LOCAL_RLS_CONFIG_DIR=%s: no such directory", s.RLSConfigDir)
	}
	if s.PolicyFile != "" {
		if st, err := os.Stat(s.PolicyFile); err != nil || !st.Mode().IsRegular() {
			bad("LOCAL_POLICY_FILE=%s: no such file", s.PolicyFile)
		}
	}
	if s.PolicyDir != "" && s.PolicyFile == "" {
		bad("LOCAL_POLICY_DIR needs LOCAL_POLICY_FILE (the apps' first policies)")
	}
	if s.RedisPassword == "" {
		bad("no Redis password (requirepass in redis/redis.conf or REDIS_PASSWORD)")
	}
	for _, p := range s.listeners() {
		if p.port < 1 || p.port > 65535 {
			bad("%s: %s's port %d is not a port (want 1-65535)", p.variable, p.service, p.port)
		}
	}
	return errors.Join(errs...)
}

// Help is the settings' list, as `localstack help` prints it.
func Help() string {
	var b strings.Builder
	for _, v := range variables {
		def := v.Default
		if def == "" {
			def = "unset"
		}
		fmt.Fprintf(&b, "  %s (%s)\n      %s\n", v.Name, def, v.Doc)
	}
	return b.String()
}

// Get returns the value of the saved setting name (a variable's Name) as
// stack.env holds it; false for a name that is not saved.
func (s Settings) Get(name string) (string, bool) {
	for _, v := range variables {
		if v.Name == name && v.Saved {
			return v.get(&s), true
		}
	}
	return "", false
}
