//go:build linux

package stacktest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	chaosstack "github.com/fleetlimit/fleetlimit/chaos/stack"
)

// installHint is how to get the programs the native stack needs.
const installHint = "apt-get install redis-server nginx-light curl (or, from the repository root: make deps)"

const (
	// scriptTimeout bounds one call of local-up.sh, local-down.sh or
	// local-service.sh (each builds bin/localstack, local-up.sh two more
	// binaries, then waits up to LOCAL_READY_TIMEOUT, 30 s).
	scriptTimeout = 2 * time.Minute
	// pollInterval is the pause between two probes while waiting for a
	// state change.
	pollInterval = 20 * time.Millisecond
	// logTailLines is how much of each log a failure shows.
	logTailLines = 30
	// redisTimeout is the apps' RL_REDIS_TIMEOUT (see stackEnv).
	redisTimeout = "500ms"
)

// Port layout of a test stack, as offsets from a base port: nginx on base,
// appN on base+N (LOCAL_APP_PORT_BASE = base), Redis on base+5, the
// toxiproxy API on base+6, Prometheus on base+7, the static site on
// base+8, nginx's gRPC on base+9, appN's admin port on base+10+N, appN's
// redis_via proxy on base+20+N, appN's gRPC on base+25+N.
const (
	offRedis      = 5
	offProxyAPI   = 6
	offPrometheus = 7
	offStatic     = 8
	offRLS        = 9
	offAdminBase  = 10
	offViaBase    = 20
	offGRPCBase   = 25
	blockSize     = 30
)

// Port blocks are picked below the Linux ephemeral range (32768-60999 by
// default), where the kernel never hands out ports for outgoing connections
// or port-0 listeners (redistest's servers), and away from the usual stack
// (8080-8084, 9081-9084, 6390, 8474, 16391-16394).
const (
	blockMin = 20000
	blockMax = 32000
)

// stack is a native stack started by startStack, in its own run dir.
type stack struct {
	root     string   // the checkout
	runDir   string   // LOCAL_RUN_DIR
	env      []string // the environment of every script call
	password string   // Redis' requirepass
	info     chaosstack.Info
	client   *http.Client
	// source is the loopback address the test's requests come from (see
	// from); nil: the kernel's choice, 127.0.0.1.
	source atomic.Pointer[net.TCPAddr]

	mu sync.Mutex
	// localAdmitted counts the 200s answered with X-RateLimit-Mode: local,
	// and localAnswered every answer (200 or 429) decided locally: the
	// journals must account for a grant of the route's policy per 200, and
	// one of the per-address ceiling per answer (the test's addresses stay
	// below the ceiling, so it admits every request).
	localAdmitted, localAnswered int
}

// requireTools fails (CI set) or skips the test when a program the stack
// needs is missing, with the install hint, as the Redis test helpers do.
func requireTools(t *testing.T) {
	t.Helper()
	var missing []string
	for _, bin := range []string{"redis-server", "redis-cli", "nginx", "curl"} {
		if findBin(bin) == "" {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("stacktest: %s not found in PATH or the sbin directories; install with: %s",
		strings.Join(missing, ", "), installHint)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// findBin looks bin up as the native stack does (native.FindBin): PATH,
// then the directories an ordinary user's PATH may lack.
func findBin(bin string) string {
	if p, err := exec.LookPath(bin); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/bin", "/usr/local/bin"} {
		p := filepath.Join(dir, bin)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// repoRoot is the checkout: the nearest directory above the test's that
// holds scripts/local-up.sh.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "local-up.sh")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("stacktest: no scripts/local-up.sh above the working directory")
		}
		dir = parent
	}
}

// freeBlock returns a base port whose whole block is free a moment ago.
func freeBlock() (int, error) {
	for range 100 {
		base := blockMin + mrand.IntN(blockMax-blockMin-blockSize)
		if blockFree(base) {
			return base, nil
		}
	}
	return 0, errors.New("stacktest: no free block of ports")
}

func blockFree(base int) bool {
	for p := base; p < base+blockSize; p++ {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// stackEnv is the caller's environment without the settings that would
// change the stack (LOCAL_*, RL_*, REDIS_PASSWORD), plus ours.
func stackEnv(runDir string, base int, password string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "LOCAL_") || strings.HasPrefix(kv, "RL_") || strings.HasPrefix(kv, "REDIS_PASSWORD=") {
			continue
		}
		env = append(env, kv)
	}
	port := func(p int) string { return strconv.Itoa(p) }
	return append(env,
		"LOCAL_RUN_DIR="+runDir,
		"LOCAL_HOST=127.0.0.1",
		"LOCAL_NGINX_PORT="+port(base),
		"LOCAL_APP_PORT_BASE="+port(base),
		"LOCAL_REDIS_PORT="+port(base+offRedis),
		"LOCAL_PROXY_API_PORT="+port(base+offProxyAPI),
		"LOCAL_ADMIN_PORT_BASE="+port(base+offAdminBase),
		"LOCAL_VIA_PORT_BASE="+port(base+offViaBase),
		"LOCAL_PROMETHEUS_PORT="+port(base+offPrometheus),
		// The embedded default's copy, which checkReload changes.
		"LOCAL_POLICY_FILE="+filepath.Join(runDir, policyFileName),
		"LOCAL_STATIC_PORT="+port(base+offStatic),
		"LOCAL_RLS_PORT="+port(base+offRLS),
		"LOCAL_GRPC_PORT_BASE="+port(base+offGRPCBase),
		"REDIS_PASSWORD="+password,
		"RL_API_KEY_SECRET="+stackSecret,
		"RL_ADMIN_TOKEN="+stackAdminToken,
		// The demo's 50 ms per Redis call is for an idle machine; under
		// `make test` (every package's -race tests at once) a call can miss
		// it, and one answer decided locally spoils the exact counts the
		// checks rely on. Latency is the chaos suite's to judge, not this
		// test's; a dead Redis is detected by refused connections, not by
		// this timeout.
		"LOCAL_REDIS_TIMEOUT="+redisTimeout,
	)
}

// startStack runs scripts/local-up.sh (which builds bin/localstack,
// bin/ratelimiter and bin/toxiproxy-server from the checkout) with
// LOCAL_RUN_DIR in a temp dir and a free block of ports, and reads
// stack.json. t.Cleanup stops the stack with scripts/local-down.sh, prints
// the logs' tails if the test failed, and checks that no process of the
// stack is left.
func startStack(t *testing.T) *stack {
	t.Helper()
	requireTools(t)
	s := &stack{
		root:     repoRoot(t),
		runDir:   t.TempDir(), // removed after the cleanup below has run
		password: "stacktest-" + randomHex(8),
	}
	s.client = &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true, DialContext: s.dial},
	}
	t.Cleanup(func() { s.stop(t) })
	writeDefaultPolicies(t, s)

	for attempt := 1; ; attempt++ {
		base, err := freeBlock()
		if err != nil {
			t.Fatal(err)
		}
		s.env = stackEnv(s.runDir, base, s.password)
		start := time.Now()
		out, err := s.script("local-up.sh")
		if err == nil {
			t.Logf("local-up.sh: %v (ports %d-%d, run dir %s)", time.Since(start).Round(time.Millisecond), base, base+blockSize-1, s.runDir)
			break
		}
		// Another program may take a port between the probe and the start.
		if attempt < 3 && bytes.Contains(out, []byte("ports already in use")) {
			t.Logf("local-up.sh: a port was taken meanwhile; another block (%v)", err)
			continue
		}
		t.Fatalf("local-up.sh: %v\n%s", err, out)
	}
	s.readInfo(t)
	if len(s.info.Apps) != 4 || s.info.RedisPID <= 0 || s.info.NginxURL == "" {
		t.Fatalf("stack.json: want 4 apps, a redis_pid and nginx_url, got %+v", s.info)
	}
	return s
}

// script runs scripts/NAME with the stack's environment and returns its
// combined output.
func (s *stack) script(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.root, "scripts", name), args...)
	cmd.Dir = s.root
	cmd.Env = s.env
	cmd.WaitDelay = 5 * time.Second // the services it starts do not hold our pipes, but just in case
	return cmd.CombinedOutput()
}

func (s *stack) readInfo(t *testing.T) {
	t.Helper()
	info, err := chaosstack.ReadInfo(filepath.Join(s.runDir, "stack.json"))
	if err != nil {
		t.Fatal(err)
	}
	s.info = info
}

// stop is the cleanup: log tails on failure, local-down.sh, then a check
// that every process recorded in the run dir's pid files is gone (a
// survivor is killed, being ours, and reported).
func (s *stack) stop(t *testing.T) {
	if s.env == nil {
		return // local-up.sh never ran
	}
	if t.Failed() {
		t.Log(s.logTails())
	}
	pids := s.recordedPIDs()
	start := time.Now()
	out, err := s.script("local-down.sh")
	if err != nil {
		t.Errorf("local-down.sh: %v\n%s", err, out)
	} else {
		t.Logf("local-down.sh: %v", time.Since(start).Round(time.Millisecond))
	}
	for name, pid := range pids {
		if processRunning(pid) {
			t.Errorf("%s (pid %d) still running after local-down.sh: killing it", name, pid)
			_ = kill(pid)
		}
	}
}

// recordedPIDs reads the run dir's pid files.
func (s *stack) recordedPIDs() map[string]int {
	pids := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(s.runDir, "pids", "*.pid"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			pids[strings.TrimSuffix(filepath.Base(f), ".pid")] = pid
		}
	}
	return pids
}

// processRunning reports whether pid is alive and not a zombie.
func processRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, after, ok := bytes.Cut(b, []byte(") ")) // the command may hold spaces
	return ok && len(after) > 0 && after[0] != 'Z'
}

// cmdline is the command line of pid, arguments separated by spaces.
func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return string(bytes.ReplaceAll(bytes.TrimRight(b, "\x00"), []byte{0}, []byte{' '}))
}

// logTails returns the last lines of every log in the run dir.
func (s *stack) logTails() string {
	files, _ := filepath.Glob(filepath.Join(s.runDir, "*.log"))
	files = append(files, filepath.Join(s.runDir, "nginx", "error.log"))
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		lines = lines[max(0, len(lines)-logTailLines):]
		rel, _ := filepath.Rel(s.runDir, f)
		fmt.Fprintf(&b, "\n---- last lines of %s ----\n%s\n", rel, strings.Join(lines, "\n"))
	}
	return b.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ---- HTTP -------------------------------------------------------------------------

// reply is one answer through nginx.
type reply struct {
	status int
	header http.Header
	body   []byte
	sent   time.Time
	recv   time.Time
}

func (r reply) mode() string     { return r.header.Get("X-RateLimit-Mode") }
func (r reply) servedBy() string { return r.header.Get("X-Served-By") }

// get sends GET path through nginx with the given headers (nil: none) and
// counts a 200 decided by a fallback budget.
func (s *stack) get(path string, hdr http.Header) (reply, error) {
	req, err := http.NewRequest(http.MethodGet, s.info.NginxURL+path, nil)
	if err != nil {
		return reply{}, err
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	r := reply{sent: time.Now()}
	resp, err := s.client.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	r.body, err = io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("GET %s: body: %w", path, err)
	}
	r.recv, r.status, r.header = time.Now(), resp.StatusCode, resp.Header
	if r.mode() == "local" && (r.status == http.StatusOK || r.status == http.StatusTooManyRequests) {
		s.mu.Lock()
		s.localAnswered++
		if r.status == http.StatusOK {
			s.localAdmitted++
		}
		s.mu.Unlock()
	}
	return r, nil
}

// mustGet is get that fails the test on a transport error or a 5xx.
func (s *stack) mustGet(t *testing.T, path string, hdr http.Header) reply {
	t.Helper()
	r, err := s.get(path, hdr)
	if err != nil {
		t.Fatal(err)
	}
	if r.status >= 500 {
		t.Fatalf("GET %s: %d (a 5xx)\n%s", path, r.status, r.body)
	}
	return r
}

// stackSecret is the test stack's RL_API_KEY_SECRET.
const stackSecret = "stacktest-secret-" + "0123456789"

// stackAdminToken is the test stack's RL_ADMIN_TOKEN.
const stackAdminToken = "stacktest-admin-token-" + "0123456789abcdef"

// withKey returns headers carrying a valid API key whose identity is id
// (characters an id cannot hold become '-'; at most the 64 bytes of an
// apikey id).
func withKey(id string) http.Header {
	b := []byte(id)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return rawKey(mustSign(stackSecret, string(b)))
}

// rawKey returns headers carrying X-API-Key: v as it is.
func rawKey(v string) http.Header { return http.Header{"X-Api-Key": {v}} }

func mustSign(secret, id string) string {
	v, err := apikey.NewVerifier(secret)
	if err != nil {
		panic(err)
	}
	k, err := v.Sign(id)
	if err != nil {
		panic(err)
	}
	return k
}

// from makes the test's requests come from the loopback address ip (nginx
// sees it as the client's address), and drops the idle connections from
// the one before. Each check has its own, so that no check spends another's
// per-address ceiling.
func (s *stack) from(ip string) {
	s.source.Store(&net.TCPAddr{IP: net.ParseIP(ip)})
	s.client.CloseIdleConnections()
}

// dial connects from the current source address.
func (s *stack) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if src := s.source.Load(); src != nil {
		d.LocalAddr = src
	}
	return d.DialContext(ctx, network, addr)
}

// rawGet sends a hand-written request over TCP, for header bytes Go's client
// refuses to send, and reads the answer.
func (s *stack) rawGet(path string, headerLines ...string) (*http.Response, []byte, error) {
	addr := strings.TrimPrefix(s.info.NginxURL, "http://")
	conn, err := s.dial(context.Background(), "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: %s\r\n", path, addr)
	for _, l := range headerLines {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("Connection: close\r\n\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

// appStatus is the part of an instance's admin /status the test reads.
type appStatus struct {
	Instance string `json:"instance"`
	Mode     string `json:"mode"`
	Breaker  string `json:"breaker"`
	Limiter  *struct {
		Breaker string                 `json:"breaker"`
		Journal resilient.JournalStats `json:"journal"`
	} `json:"limiter"`
}

func (s *stack) status(app chaosstack.App) (appStatus, error) {
	resp, err := s.client.Get(app.AdminURL + "/status")
	if err != nil {
		return appStatus{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return appStatus{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return appStatus{}, fmt.Errorf("%s /status: %d %s", app.Name, resp.StatusCode, body)
	}
	var st appStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return appStatus{}, fmt.Errorf("%s /status: %w", app.Name, err)
	}
	if st.Limiter == nil {
		return appStatus{}, fmt.Errorf("%s /status: no \"limiter\" object: %s", app.Name, body)
	}
	return st, nil
}

// waitFor calls check every pollInterval until it returns nil or d has
// passed; it returns how long that took, or check's last error.
func waitFor(d time.Duration, check func() error) (time.Duration, error) {
	start := time.Now()
	for {
		err := check()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Since(start) >= d {
			return time.Since(start), fmt.Errorf("not within %v: %w", d, err)
		}
		time.Sleep(pollInterval)
	}
}

// appNames are the names of the stack's instances, sorted.
func (s *stack) appNames() []string {
	var names []string
	for _, a := range s.info.Apps {
		names = append(names, a.Name)
	}
	slices.Sort(names)
	return names
}
