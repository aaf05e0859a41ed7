package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Local is the native stack of `make local-up`.
//
// Processes are restarted with scripts/local-service.sh, which starts a
// service with the settings local-up.sh used and keeps .run/pids/ and
// .run/stack.json current, so `make local-down` still stops everything.
// Without that script, a killed process is started again from what
// /proc/<pid> said before the kill (command line, environment, working
// directory), and Down stops such processes itself.
//
// Local is not safe for concurrent use.
type Local struct {
	httpAPI
	r     runner
	built bool
	info  Info

	mu      sync.Mutex
	saved   map[string]procSpec // by service, captured before a kill
	spawned []*exec.Cmd         // fallback restarts, stopped by Down
}

// procSpec is how to start a process again.
type procSpec struct {
	args []string
	env  []string
	dir  string
	// redis only: where its data files are, for a wipe.
	dataFiles []string
}

// NewLocal returns the native stack of the repository at root; command
// output goes to log.
func NewLocal(root string, log io.Writer) *Local {
	return &Local{
		httpAPI: newHTTPAPI(),
		r:       runner{root: root, log: log},
		saved:   map[string]procSpec{},
	}
}

// Name implements Stack.
func (l *Local) Name() string { return "local" }

// Unsupported implements Stack: the native stack injects every fault.
func (l *Local) Unsupported(string) string { return "" }

func (l *Local) stackJSON() string { return filepath.Join(l.r.root, ".run", "stack.json") }

func (l *Local) serviceScript() string { return filepath.Join(l.r.root, "scripts", "local-service.sh") }

// Up implements Stack: make local-down, then make local-up (the binaries are
// built by the first Up only), then reads .run/stack.json.
func (l *Local) Up(ctx context.Context, _ string) (Info, error) {
	if err := l.r.run(ctx, "make", "--no-print-directory", "local-down"); err != nil {
		return Info{}, err
	}
	r := l.r
	r.env = slices.Clone(r.env)
	if l.built {
		r.env = append(r.env, "LOCAL_SKIP_BUILD=1")
	}
	if os.Getenv("LOCAL_POLICY_FILE") == "" {
		// The load comes from one address: a per-address ceiling sized
		// for it (the demo's would refuse most of it).
		r.env = append(r.env, "LOCAL_POLICY_FILE="+filepath.Join(l.r.root, PolicyFile))
	}
	if err := r.run(ctx, "make", "--no-print-directory", "local-up"); err != nil {
		return Info{}, err
	}
	l.built = true
	info, err := l.readInfo()
	if err != nil {
		return Info{}, err
	}
	if info.ProxyAPI == "" || len(info.Apps) == 0 || info.RedisPID <= 0 {
		return Info{}, fmt.Errorf("%s: incomplete: %+v", l.stackJSON(), info)
	}
	return info, nil
}

// readInfo reads .run/stack.json (local-service.sh rewrites it after each
// restart, with the new pids).
func (l *Local) readInfo() (Info, error) {
	b, err := os.ReadFile(l.stackJSON())
	if err != nil {
		return Info{}, fmt.Errorf("stack.json: %w", err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, fmt.Errorf("stack.json: %w", err)
	}
	l.info = info
	return info, nil
}

// Down implements Stack: stops the processes the fallback started, then
// make local-down. Safe to call twice.
func (l *Local) Down(ctx context.Context) error {
	l.mu.Lock()
	spawned := l.spawned
	l.spawned = nil
	l.mu.Unlock()
	for _, c := range spawned {
		_ = c.Process.Signal(syscall.SIGCONT)
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range spawned {
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	// Not ctx: the stack must stop even when the run was interrupted.
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	return l.r.run(stopCtx, "make", "--no-print-directory", "local-down")
}

// pidOf returns the current pid of a service ("redis" or an app) from
// stack.json, checking that the process still runs the expected program.
func (l *Local) pidOf(service string) (int, error) {
	info, err := l.readInfo()
	if err != nil {
		return 0, err
	}
	pid, want := 0, "ratelimiter"
	if service == "redis" {
		pid, want = info.RedisPID, "redis-server"
	} else {
		for _, a := range info.Apps {
			if a.Name == service {
				pid = a.PID
			}
		}
	}
	if pid <= 0 {
		return 0, fmt.Errorf("%s: no pid in stack.json (not running?)", service)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(want)) {
		return 0, fmt.Errorf("%s: pid %d is not %s", service, pid, want)
	}
	return pid, nil
}

// capture records how to start pid again, for the fallback restart (only
// needed without scripts/local-service.sh).
func (l *Local) capture(service string, pid int) {
	if isFile(l.serviceScript()) {
		return
	}
	spec, err := readProc(pid)
	if err != nil {
		fmt.Fprintf(l.r.log, "chaos: reading /proc/%d of %s: %v (restart will need scripts/local-service.sh)\n", pid, service, err)
		return
	}
	if service == "redis" {
		spec.dataFiles = l.redisDataFiles(spec)
	}
	l.mu.Lock()
	l.saved[service] = spec
	l.mu.Unlock()
}

func readProc(pid int) (procSpec, error) {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return procSpec{}, err
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return procSpec{}, err
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return procSpec{}, err
	}
	split := func(b []byte) []string {
		var out []string
		for s := range strings.SplitSeq(strings.TrimRight(string(b), "\x00"), "\x00") {
			if s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	spec := procSpec{args: split(cmdline), env: split(environ), dir: cwd}
	if len(spec.args) == 0 {
		return procSpec{}, fmt.Errorf("pid %d: empty command line", pid)
	}
	return spec, nil
}

// redisDataFiles asks Redis where its AOF directory and RDB file are
// (CONFIG GET dir, appenddirname, dbfilename).
func (l *Local) redisDataFiles(spec procSpec) []string {
	rdb := redis.NewClient(&redis.Options{
		Addr: l.info.RedisAddr, Password: RedisPassword(l.r.root, spec.args),
		DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1,
	})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	get := func(name string) string {
		m, err := rdb.ConfigGet(ctx, name).Result()
		if err != nil {
			return ""
		}
		return m[name]
	}
	dir := get("dir")
	if dir == "" {
		return nil
	}
	var out []string
	for _, name := range []string{get("appenddirname"), get("dbfilename")} {
		if name != "" && !strings.Contains(name, "/") {
			out = append(out, filepath.Join(dir, name))
		}
	}
	return out
}

// RedisPassword is the demo Redis' password: $REDIS_PASSWORD, else the
// --requirepass argument of its command line, else requirepass in
// redis/redis.conf.
func RedisPassword(root string, redisArgs []string) string {
	if p := os.Getenv("REDIS_PASSWORD"); p != "" {
		return p
	}
	for i, a := range redisArgs {
		if a == "--requirepass" && i+1 < len(redisArgs) {
			return redisArgs[i+1]
		}
	}
	b, err := os.ReadFile(filepath.Join(root, "redis", "redis.conf"))
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "requirepass" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// Flush implements Stack: FLUSHALL and BGREWRITEAOF.
func (l *Local) Flush(ctx context.Context) error { return flush(ctx, l.RedisClient()) }

// flush empties Redis and compacts its AOF, then closes rdb.
func flush(ctx context.Context, rdb *redis.Client) error {
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return fmt.Errorf("redis flushall: %w", err)
	}
	if err := rdb.BgRewriteAOF(ctx).Err(); err != nil {
		return fmt.Errorf("redis bgrewriteaof: %w", err)
	}
	return nil
}

// RedisClient returns a client of the stack's Redis (for the checks after
// settle).
func (l *Local) RedisClient() *redis.Client {
	var args []string
	if spec, err := readProc(l.info.RedisPID); err == nil {
		args = spec.args
	}
	return redis.NewClient(&redis.Options{
		Addr: l.info.RedisAddr, Password: RedisPassword(l.r.root, args),
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1,
	})
}

func (l *Local) signal(service string, sig syscall.Signal) error {
	pid, err := l.pidOf(service)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("kill -%d %s (pid %d): %w", sig, service, pid, err)
	}
	return nil
}

// KillRedis implements Stack: SIGKILL.
func (l *Local) KillRedis(context.Context) error {
	pid, err := l.pidOf("redis")
	if err != nil {
		return err
	}
	l.capture("redis", pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill redis (pid %d): %w", pid, err)
	}
	return nil
}

// PauseRedis implements Stack: SIGSTOP.
func (l *Local) PauseRedis(context.Context) error { return l.signal("redis", syscall.SIGSTOP) }

// ResumeRedis implements Stack: SIGCONT.
func (l *Local) ResumeRedis(context.Context) error { return l.signal("redis", syscall.SIGCONT) }

// KillApp implements Stack: SIGKILL.
func (l *Local) KillApp(_ context.Context, app string) error {
	pid, err := l.pidOf(app)
	if err != nil {
		return err
	}
	l.capture(app, pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s (pid %d): %w", app, pid, err)
	}
	return nil
}

// StartRedis implements Stack.
func (l *Local) StartRedis(ctx context.Context, wipe bool) error {
	if isFile(l.serviceScript()) {
		args := []string{"start", "redis"}
		if wipe {
			args = append(args, "--wipe")
		}
		if err := l.r.run(ctx, l.serviceScript(), args...); err != nil {
			return err
		}
		_, err := l.readInfo()
		return err
	}
	spec, ok := l.savedSpec("redis")
	if !ok {
		return errors.New("start redis: no scripts/local-service.sh and no saved command line")
	}
	if wipe {
		for _, f := range spec.dataFiles {
			if err := os.RemoveAll(f); err != nil {
				return fmt.Errorf("wipe redis data: %w", err)
			}
		}
	}
	if err := l.spawn("redis", spec); err != nil {
		return err
	}
	return waitFor(ctx, 30*time.Second, func(ctx context.Context) error {
		rdb := l.RedisClient()
		defer rdb.Close()
		return rdb.Ping(ctx).Err()
	})
}

// StartApp implements Stack.
func (l *Local) StartApp(ctx context.Context, app string) error {
	if isFile(l.serviceScript()) {
		if err := l.r.run(ctx, l.serviceScript(), "start", app); err != nil {
			return err
		}
		_, err := l.readInfo()
		return err
	}
	spec, ok := l.savedSpec(app)
	if !ok {
		return fmt.Errorf("start %s: no scripts/local-service.sh and no saved command line", app)
	}
	if err := l.spawn(app, spec); err != nil {
		return err
	}
	return l.waitReady(ctx, l.info, app, 30*time.Second)
}

func (l *Local) savedSpec(service string) (procSpec, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.saved[service]
	return s, ok
}

// spawn starts a process from its spec in its own session, output appended
// to .run/<service>.log.
func (l *Local) spawn(service string, spec procSpec) error {
	logf, err := os.OpenFile(filepath.Join(l.r.root, ".run", service+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(spec.args[0], spec.args[1:]...)
	cmd.Env, cmd.Dir = spec.env, spec.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", service, err)
	}
	fmt.Fprintf(l.r.log, "chaos: started %s again from its /proc command line (pid %d)\n", service, cmd.Process.Pid)
	l.mu.Lock()
	l.spawned = append(l.spawned, cmd)
	l.mu.Unlock()
	l.setPID(service, cmd.Process.Pid)
	return nil
}

func (l *Local) setPID(service string, pid int) {
	if service == "redis" {
		l.info.RedisPID = pid
		return
	}
	for i := range l.info.Apps {
		if l.info.Apps[i].Name == service {
			l.info.Apps[i].PID = pid
		}
	}
}

// Partition implements Stack: disables (on) or enables the app's toxiproxy
// proxy; disabling closes its connections.
func (l *Local) Partition(ctx context.Context, app string, on bool) error {
	proxy, err := l.proxyOf(app)
	if err != nil {
		return err
	}
	body := fmt.Sprintf(`{"enabled":%t}`, !on)
	return l.proxyCall(ctx, l.info.ProxyAPI, http.MethodPost, "/proxies/"+proxy, body, false)
}

// Latency implements Stack: a latency toxic on every app's proxy.
func (l *Local) Latency(ctx context.Context, d time.Duration) error {
	return l.latency(ctx, l.info, d)
}

// Status implements Stack: GET <admin_url>/status.
func (l *Local) Status(ctx context.Context, app string) ([]byte, error) {
	return l.status(ctx, l.info, app)
}

func (l *Local) proxyOf(app string) (string, error) {
	for _, a := range l.info.Apps {
		if a.Name == app && a.Proxy != "" {
			return a.Proxy, nil
		}
	}
	return "", fmt.Errorf("%s: no proxy in stack.json", app)
}

// waitFor polls check every 100 ms until it succeeds, for at most d.
func waitFor(ctx context.Context, d time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready within %v: %w", d, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
