package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redistest"
)

// binary is the ratelimiter built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ratelimiter-test")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "ratelimiter")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		_ = os.RemoveAll(dir)
		panic("go build: " + err.Error())
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// command returns the binary with a clean RL_* environment plus env.
func command(ctx context.Context, t *testing.T, args []string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, binary, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "RL_INSTANCE=cmd-test", "RL_LISTEN_ADDR=127.0.0.1:0", "RL_ADMIN_ADDR=127.0.0.1:0")
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

func TestConfigErrorExits2WithOneLine(t *testing.T) {
	tests := []struct{ env, wantPrefix string }{
		{"RL_REDIS_TIMEOUT=abc", `ratelimiter: RL_REDIS_TIMEOUT: time: invalid duration "abc"`},
		{"RL_EXPECTED_INSTANCES=-1", `ratelimiter: RL_EXPECTED_INSTANCES: must be at least 1`},
		{"RL_POLICY_FILE=/nonexistent.json", `ratelimiter: RL_POLICY_FILE: open /nonexistent.json`},
		// The README publishes it: refused outside demo mode (RL_DEMO).
		{"RL_API_KEY_SECRET=fleetlimit-demo-secret-change-me", `ratelimiter: RL_API_KEY_SECRET: is the published demo secret`},
		{"RL_ADMIN_TOKEN=fleetlimit-demo-admin-token-change-me", `ratelimiter: RL_ADMIN_TOKEN: is the published demo token`},
		// An admin port on every interface needs a token.
		{"RL_ADMIN_ADDR=:0", `ratelimiter: RL_ADMIN_TOKEN: required: RL_ADMIN_ADDR :0 is not a loopback address`},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := command(ctx, t, nil, tt.env)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if code := exitCode(err); code != 2 {
				t.Errorf("exit code %d (%v), want 2", code, err)
			}
			lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], tt.wantPrefix) {
				t.Errorf("stderr = %q, want one line starting with %q", stderr.String(), tt.wantPrefix)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

// TestRedisTLSWrongCAExits2: a Redis whose certificate the CA file does
// not sign stops the start like any bad setting (exit 2, one line naming
// RL_REDIS_TLS_CA_FILE), rather than running on the fallback for good.
func TestRedisTLSWrongCAExits2(t *testing.T) {
	certs := redistest.NewCertificates(t)
	srv := redistest.StartServer(t, redistest.ServerOptions{TLS: &redistest.TLSOptions{Certs: certs}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := command(ctx, t, nil, "RL_REDIS_ADDRS="+srv.Addr(), "RL_REDIS_TLS=true", "RL_REDIS_TLS_CA_FILE="+certs.OtherCAFile,
		"RL_REDIS_TLS_CERT_FILE="+certs.ClientCert, "RL_REDIS_TLS_KEY_FILE="+certs.ClientKey)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if code := exitCode(cmd.Run()); code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	want := "ratelimiter: RL_REDIS_TLS_CA_FILE: " + srv.Addr() + "'s certificate is not signed by a CA in RL_REDIS_TLS_CA_FILE"
	if len(lines) != 1 || !strings.HasPrefix(lines[0], want) {
		t.Errorf("stderr = %q, want one line starting with %q", stderr.String(), want)
	}
}

// serving is the log line that says where a started binary listens.
type serving struct {
	Msg        string `json:"msg"`
	PublicAddr string `json:"public_addr"`
	AdminAddr  string `json:"admin_addr"`
}

// serve starts the binary with env and waits for its serving line; the
// rest of its log goes to the returned channel, one line at a time. The
// process is killed at the end of the test unless it has exited.
func serve(ctx context.Context, t *testing.T, env ...string) (*exec.Cmd, serving, *bytes.Buffer, <-chan string) {
	t.Helper()
	cmd := command(ctx, t, nil, env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	var srv serving
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &srv); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if srv.Msg == "serving" {
			break
		}
	}
	if srv.PublicAddr == "" {
		t.Fatalf("no serving line; stderr %s", stderr.String())
	}
	lines := make(chan string, 1024)
	go func() { // keep the pipe drained
		defer close(lines)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	return cmd, srv, &stderr, lines
}

// TestServeAndSIGTERM runs the binary, finds its ports in its first log
// line, checks a demo route and the healthcheck flag against it, then stops
// it with SIGTERM: exit 0.
func TestServeAndSIGTERM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, serving, stderr, _ := serve(ctx, t, "RL_DEBUG_HEADERS=true")

	resp, err := http.Get("http://" + serving.PublicAddr + "/api/token-bucket")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Served-By") != "cmd-test" || resp.Header.Get("RateLimit") == "" {
		t.Errorf("status %d, headers %v", resp.StatusCode, resp.Header)
	}

	for url, want := range map[string]int{
		"http://" + serving.AdminAddr + "/healthz": 0,
		"http://" + serving.AdminAddr + "/nope":    1,
	} {
		if code := exitCode(command(ctx, t, []string{"-healthcheck", url}).Run()); code != want {
			t.Errorf("-healthcheck %s: exit %d, want %d", url, code, want)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v (stderr %q)", err, stderr.String())
	}
}

// TestSIGHUPReloads: SIGHUP re-reads RL_POLICY_FILE (the heartbeat, and
// so the file watcher, is an hour here: only the signal can do it); a bad
// file is logged and the process keeps serving the policies it had.
func TestSIGHUPReloads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	policies := func(limit string) string {
		return `{"policies": [{"name": "p", "algorithm": "gcra", "limit": ` + limit + `, "window": "10s"}],
		  "routes": [{"pattern": "/api/*", "policies": ["p"]}]}`
	}
	path := filepath.Join(t.TempDir(), "policies.json")
	if err := os.WriteFile(path, []byte(policies("100")), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, srv, stderr, lines := serve(ctx, t, "RL_POLICY_FILE="+path, "RL_HEARTBEAT_INTERVAL=59m", "RL_HEARTBEAT_TTL=60m")
	header := func() string {
		resp, err := http.Get("http://" + srv.PublicAddr + "/api/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get("RateLimit-Policy")
	}
	// hup sends SIGHUP and returns the message of the reload's log line.
	hup := func() string {
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for line := range lines {
			var l struct{ Msg, Trigger string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Trigger == "signal" {
				return l.Msg
			}
		}
		t.Fatalf("the log ended; stderr %s", stderr.String())
		return ""
	}
	if got := header(); got != `"p";q=100;w=10` {
		t.Fatalf("RateLimit-Policy at start = %q", got)
	}
	if err := os.WriteFile(path, []byte(policies("20")), 0o600); err != nil {
		t.Fatal(err)
	}
	if msg := hup(); msg != "policies reloaded" {
		t.Errorf("after SIGHUP: %q", msg)
	}
	if got := header(); got != `"p";q=20;w=10` {
		t.Errorf("RateLimit-Policy after SIGHUP = %q", got)
	}
	if err := os.WriteFile(path, []byte(`{"policies": []}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if msg := hup(); msg != "policy file rejected; the policies in force stay" {
		t.Errorf("after SIGHUP with a bad file: %q", msg)
	}
	if got := header(); got != `"p";q=20;w=10` {
		t.Errorf("RateLimit-Policy after a bad file = %q", got)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v (stderr %q)", err, stderr.String())
	}
}

func TestHealthcheck(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer ok.Close()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer failing.Close()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer slow.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	tests := []struct {
		name, url string
		want      int
	}{
		{"2xx", ok.URL, 0},
		{"503", failing.URL, 1},
		{"refused", closedURL, 1},
		{"timeout", slow.URL, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			if code := exitCode(command(ctx, t, []string{"-healthcheck", tt.url}).Run()); code != tt.want {
				t.Errorf("exit %d, want %d", code, tt.want)
			}
			if d := time.Since(start); d > 4*time.Second {
				t.Errorf("took %v, want about 2 s at most", d)
			}
		})
	}
}

// TestKeys: -keys N prints N distinct keys the service's secret accepts
// (checked with a verifier of the same secrets, the second one current
// elsewhere), -key-id the key of one id; without a secret it exits 2.
func TestKeys(t *testing.T) {
	const secrets = "cmd-test-secret-0123456789,older-secret-0123456789"
	v, err := apikey.NewVerifier("older-secret-0123456789", "cmd-test-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) ([]string, int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := command(ctx, t, args, "RL_API_KEY_SECRET="+secrets)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return strings.Fields(stdout.String()), exitCode(err), stderr.String()
	}
	keys, code, stderr := run("-keys", "5")
	if code != 0 || len(keys) != 5 {
		t.Fatalf("-keys 5: exit %d, %d keys, stderr %q", code, len(keys), stderr)
	}
	seen := map[string]bool{}
	for _, k := range keys {
		id, err := v.Check(k)
		if err != nil || seen[id] {
			t.Errorf("key %q: id %q, %v (duplicate %v)", k, id, err, seen[id])
		}
		seen[id] = true
	}
	keys, code, _ = run("-key-id", "demo")
	if code != 0 || len(keys) != 1 {
		t.Fatalf("-key-id demo: exit %d, keys %q", code, keys)
	}
	if id, err := v.Check(keys[0]); err != nil || id != "demo" {
		t.Errorf("-key-id demo printed %q: id %q, %v", keys[0], id, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := command(ctx, t, []string{"-keys", "1"})
	var stderr2 bytes.Buffer
	cmd.Stderr = &stderr2
	if code := exitCode(cmd.Run()); code != 2 || !strings.Contains(stderr2.String(), "RL_API_KEY_SECRET") {
		t.Errorf("without a secret: exit %d, stderr %q; want 2 naming RL_API_KEY_SECRET", code, stderr2.String())
	}
}
