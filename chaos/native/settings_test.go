package native

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// testLoader is a loader on a fake checkout at root: prometheus installed
// or not, 8 cores.
func testLoader(root string, prometheus bool) *loader {
	return &loader{root: root, wd: "/work/dir", numCPU: 8,
		lookPath: func(name string) (string, bool) { return "/usr/bin/" + name, prometheus && name == "prometheus" }}
}

// fakeRoot is a checkout with what the settings read: redis/redis.conf
// and envoy/ratelimit/.
func fakeRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"redis", "envoy/ratelimit"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := "# comment\nport 6379\nrequirepass \"conf-secret\"\n"
	if err := os.WriteFile(filepath.Join(root, "redis", "redis.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}

func TestLoadDefaults(t *testing.T) {
	root := fakeRoot(t)
	s, err := load(testLoader(root, true), env())
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{
		RunDir: filepath.Join(root, ".run"), Topology: Single, Host: "127.0.0.1",
		NginxPort: 8080, RedisPort: 6390, SentinelPortBase: 26390, ProxyAPIPort: 8474,
		AppPortBase: 8080, AdminPortBase: 9080, ViaPortBase: 16390, StaticPort: 8070,
		RLSPort: 8090, GRPCPortBase: 7080, PrometheusPort: 9089,
		RedisPassword: "conf-secret", APIKeySecret: "fleetlimit-demo-secret-change-me",
		AdminToken: "fleetlimit-demo-admin-token-change-me", Demo: true, DebugClock: false,
		RLSConfigDir: filepath.Join(root, "envoy/ratelimit"),
		ReadyTimeout: 30 * time.Second, StopTimeout: 10 * time.Second, RedisTimeout: 50 * time.Millisecond,
		LogLevel: "debug", GOMAXPROCS: 2, RedisDirect: false, Prometheus: true, SkipBuild: false,
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", s, want)
	}
	if err := s.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	// Without prometheus installed, auto is off; one core still gives a P.
	c := testLoader(root, false)
	c.numCPU = 1
	if s, _ := load(c, env()); s.Prometheus || s.GOMAXPROCS != 1 {
		t.Errorf("prometheus %v, GOMAXPROCS %d; want false, 1", s.Prometheus, s.GOMAXPROCS)
	}
}

func TestLoadValues(t *testing.T) {
	root := fakeRoot(t)
	s, err := load(testLoader(root, true), env(
		"LOCAL_TOPOLOGY=cluster", "LOCAL_HOST=10.0.0.5", "LOCAL_NGINX_PORT=20000",
		"LOCAL_PROMETHEUS=0", "REDIS_PASSWORD=from-env", "RL_DEMO=false", "RL_DEBUG_CLOCK=1",
		"LOCAL_POLICY_FILE=chaos/policies.json", "LOCAL_POLICY_DIR=/abs/policies",
		"LOCAL_READY_TIMEOUT=5", "LOCAL_STOP_TIMEOUT=0", "LOCAL_REDIS_TIMEOUT=500ms",
		"LOCAL_LOG_LEVEL=INFO", "LOCAL_GOMAXPROCS=3", "LOCAL_REDIS_DIRECT=1", "LOCAL_SKIP_BUILD=1",
		"LOCAL_RUN_DIR=stack",
	))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"topology", s.Topology, Cluster},
		{"host", s.Host, "10.0.0.5"},
		{"nginx port", s.NginxPort, 20000},
		{"prometheus", s.Prometheus, false},
		{"password", s.RedisPassword, "from-env"},
		{"demo", s.Demo, false},
		{"debug clock", s.DebugClock, true},
		// Paths relative to the checkout, the run directory to the
		// working directory (as the scripts had them).
		{"policy file", s.PolicyFile, filepath.Join(root, "chaos/policies.json")},
		{"policy dir", s.PolicyDir, "/abs/policies"},
		{"run dir", s.RunDir, "/work/dir/stack"},
		{"ready timeout", s.ReadyTimeout, 5 * time.Second},
		{"stop timeout", s.StopTimeout, time.Duration(0)},
		{"redis timeout", s.RedisTimeout, 500 * time.Millisecond},
		{"log level", s.LogLevel, "INFO"},
		{"gomaxprocs", s.GOMAXPROCS, 3},
		{"direct", s.RedisDirect, true},
		{"skip build", s.SkipBuild, true},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestLoadErrors: each bad value is refused with an error naming its
// variable and value; every bad one is reported, not only the first.
func TestLoadErrors(t *testing.T) {
	root := fakeRoot(t)
	for _, tc := range []struct{ kv, want string }{
		{"LOCAL_TOPOLOGY=ring", "LOCAL_TOPOLOGY=ring: want single, sentinel or cluster"},
		{"LOCAL_NGINX_PORT=80a", "LOCAL_NGINX_PORT=80a: not a port (want 1-65535)"},
		{"LOCAL_REDIS_PORT=70000", "LOCAL_REDIS_PORT=70000: not a port"},
		{"LOCAL_APP_PORT_BASE=-1", "LOCAL_APP_PORT_BASE=-1: not a port"},
		{"LOCAL_PROMETHEUS=yes", "LOCAL_PROMETHEUS=yes: want auto, 1 or 0"},
		{"RL_DEMO=maybe", "RL_DEMO=maybe: want true or false"},
		{"LOCAL_READY_TIMEOUT=0", "LOCAL_READY_TIMEOUT=0: want a whole number of seconds, at least 1"},
		{"LOCAL_READY_TIMEOUT=1.5", "LOCAL_READY_TIMEOUT=1.5: want a whole number of seconds"},
		{"LOCAL_STOP_TIMEOUT=-1", "LOCAL_STOP_TIMEOUT=-1: want a whole number of seconds, at least 0"},
		{"LOCAL_REDIS_TIMEOUT=50", "LOCAL_REDIS_TIMEOUT=50: want a positive duration"},
		{"LOCAL_LOG_LEVEL=loud", "LOCAL_LOG_LEVEL=loud: want debug, info, warn or error"},
		{"LOCAL_GOMAXPROCS=0", "LOCAL_GOMAXPROCS=0: want a number, at least 1"},
		{"LOCAL_REDIS_DIRECT=true", "LOCAL_REDIS_DIRECT=true: want 0 or 1"},
		{"LOCAL_SKIP_BUILD=yes", "LOCAL_SKIP_BUILD=yes: want 0 or 1"},
	} {
		_, err := load(testLoader(root, false), env(tc.kv))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.kv, err, tc.want)
		}
	}
	_, err := load(testLoader(root, false), env("LOCAL_TOPOLOGY=ring", "LOCAL_RLS_PORT=x"))
	if err == nil || !strings.Contains(err.Error(), "LOCAL_TOPOLOGY") || !strings.Contains(err.Error(), "LOCAL_RLS_PORT") {
		t.Errorf("two bad values: %v, want both named", err)
	}
}

func TestValidate(t *testing.T) {
	root := fakeRoot(t)
	policy := filepath.Join(root, "p.json")
	if err := os.WriteFile(policy, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	noConf := t.TempDir() // a checkout whose redis.conf has no requirepass
	for _, tc := range []struct {
		name string
		root string
		env  []string
		want string // "" valid
	}{
		{"defaults", root, nil, ""},
		{"policy file and dir", root, []string{"LOCAL_POLICY_FILE=" + policy, "LOCAL_POLICY_DIR=/tmp/x"}, ""},
		{"sentinel on a name", root, []string{"LOCAL_TOPOLOGY=sentinel", "LOCAL_HOST=localhost"},
			"LOCAL_TOPOLOGY=sentinel needs LOCAL_HOST to be an IPv4 address, not localhost"},
		{"single on a name", root, []string{"LOCAL_HOST=localhost"}, ""},
		{"no policy file", root, []string{"LOCAL_POLICY_FILE=nope.json"}, "LOCAL_POLICY_FILE=" + filepath.Join(root, "nope.json") + ": no such file"},
		{"policy dir alone", root, []string{"LOCAL_POLICY_DIR=/tmp/x"}, "LOCAL_POLICY_DIR needs LOCAL_POLICY_FILE"},
		{"no rls dir", root, []string{"LOCAL_RLS_CONFIG_DIR=/nonexistent"}, "LOCAL_RLS_CONFIG_DIR=/nonexistent: no such directory"},
		{"no password", noConf, []string{"LOCAL_RLS_CONFIG_DIR=" + root}, "no Redis password (requirepass in redis/redis.conf or REDIS_PASSWORD)"},
		// The cluster bus is 10000 above each node's port.
		{"cluster bus beyond", root, []string{"LOCAL_TOPOLOGY=cluster", "LOCAL_REDIS_PORT=60000"},
			"LOCAL_REDIS_PORT: redis's port 70000 is not a port"},
		{"app beyond", root, []string{"LOCAL_APP_PORT_BASE=65533"}, "LOCAL_APP_PORT_BASE: app3's port 65536 is not a port"},
		{"replication proxy beyond", root, []string{"LOCAL_TOPOLOGY=sentinel", "LOCAL_VIA_PORT_BASE=65530"},
			"LOCAL_VIA_PORT_BASE: toxiproxy's port 65539 is not a port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := load(testLoader(tc.root, false), env(tc.env...))
			if err != nil {
				t.Fatal(err)
			}
			err = s.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestSavedSettings: what Up saves in stack.env, LoadSaved reads back as
// it was, whatever the environment says then (but for the variables that
// are not saved); a shell reads the same values.
func TestSavedSettings(t *testing.T) {
	root := fakeRoot(t)
	run := t.TempDir()
	s, err := load(testLoader(root, true), env("LOCAL_RUN_DIR="+run, "LOCAL_TOPOLOGY=sentinel",
		"REDIS_PASSWORD=it's a \"pass\" $word\\", "RL_ADMIN_TOKEN=a,b", "LOCAL_POLICY_FILE=/p dir/x.json",
		"LOCAL_STOP_TIMEOUT=3", "LOCAL_SKIP_BUILD=1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.saveSettings(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(run, stackEnv))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stack.env: %v, mode %v; want 600", err, fi.Mode())
	}
	later := env("LOCAL_RUN_DIR="+run, "LOCAL_TOPOLOGY=cluster", "REDIS_PASSWORD=other", "LOCAL_STOP_TIMEOUT=7")
	c := testLoader(root, false)
	saved, err := readEnvFile(filepath.Join(run, stackEnv))
	if err != nil {
		t.Fatal(err)
	}
	got, err := load(c, func(k string) string {
		if v, ok := saved[k]; ok {
			return v
		}
		return later(k)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := s
	want.StopTimeout = 7 * time.Second // not saved: the environment's
	want.SkipBuild = false
	if !reflect.DeepEqual(got, want) {
		t.Errorf("saved and read back:\n got %+v\nwant %+v", got, want)
	}
	if v, ok := got.Get("REDIS_PASSWORD"); !ok || v != s.RedisPassword {
		t.Errorf("Get(REDIS_PASSWORD) = %q, %v", v, ok)
	}
	if _, ok := got.Get("LOCAL_SKIP_BUILD"); ok {
		t.Error("Get(LOCAL_SKIP_BUILD): not a saved setting")
	}

	// A shell sourcing the file (scripts/measure-drain.sh) gets the values.
	if bash, err := exec.LookPath("bash"); err == nil {
		out, err := exec.Command(bash, "-c", `. "$1" && printf '%s|%s' "$REDIS_PASSWORD" "$LOCAL_POLICY_FILE"`, "_", filepath.Join(run, stackEnv)).Output()
		if want := s.RedisPassword + "|" + s.PolicyFile; err != nil || string(out) != want {
			t.Errorf("bash sourced stack.env: %q, %v; want %q", out, err, want)
		}
	}

	if _, err := LoadSaved(root, env("LOCAL_RUN_DIR="+t.TempDir())); err == nil || !strings.Contains(err.Error(), "no native stack is up") {
		t.Errorf("LoadSaved without a stack: %v", err)
	}
}

func TestParseEnv(t *testing.T) {
	text := `# a comment
A=plain
B=''
C='it'\''s'
D="say \"hi\" \$x"
E=back\ slash\\
F='two
lines'

G=a'b'"c"
`
	got, err := parseEnv(text)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"A": "plain", "B": "", "C": "it's", "D": `say "hi" $x`, "E": `back slash\`,
		"F": "two\nlines", "G": "abc"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseEnv:\n got %q\nwant %q", got, want)
	}
	for _, bad := range []string{"A='open\n", "no equals\n", "A=b c\n", "1A=x\n", `A="open`} {
		if _, err := parseEnv(bad); err == nil {
			t.Errorf("parseEnv(%q): no error", bad)
		}
	}
	for _, v := range []string{"", "plain/path:1,2@x%+=-", "a b", "it's", "$HOME", "\\", "a\nb", `"`} {
		m, err := parseEnv("V=" + shellQuote(v) + "\n")
		if err != nil || m["V"] != v {
			t.Errorf("shellQuote(%q) = %s: read back %q, %v", v, shellQuote(v), m["V"], err)
		}
	}
}
