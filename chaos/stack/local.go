package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/native"
)

// Local is the native stack of `make local-up`, driven through package
// native: Up starts it as `make local-up` would (with the suite's settings
// on top of the environment's), and a restarted process is started with
// the settings Up used, keeping <run>/pids/ and <run>/stack.json current,
// so that `make local-down` still stops everything.
//
// Local is not safe for concurrent use.
type Local struct {
	httpAPI
	r     runner
	built bool
	info  Info
	// runDir is the stack's run directory (.run, or LOCAL_RUN_DIR).
	runDir string
	// native is the stack Up started, with its settings; nil before.
	native *native.Stack
	// reniced: the stack's processes were given stackNice (prioritize).
	reniced bool
	// direct: the apps dial Redis itself, not their fault proxies (Up).
	direct bool
	// policyDir holds each app's own policy file, <app>.json (Up with
	// NeedsReload); "" when they share one.
	policyDir string
	// rlsDir holds each app's own rate limit service configuration,
	// <app>/ laid out as a ConfigMap mount (Up with NeedsReload); "" when
	// they share one.
	rlsDir string
	// logsAt is each process log's size when Up started the stack: the
	// logs are appended to across stacks, and KeepLogs keeps this stack's
	// part.
	logsAt map[string]int64
}

// NewLocal returns the native stack of the repository at root; command
// output goes to log.
func NewLocal(root string, log io.Writer) *Local {
	return &Local{
		httpAPI: newHTTPAPI(),
		r:       runner{root: root, log: log},
		runDir:  native.RunDir(root, os.Getenv),
	}
}

// Name implements Stack.
func (l *Local) Name() string { return "local" }

// Unsupported implements Stack: the native stack injects every fault and
// runs every topology.
func (l *Local) Unsupported(string) string { return "" }

func (l *Local) stackJSON() string { return filepath.Join(l.runDir, "stack.json") }

// Up implements Stack: the running stack is stopped (make local-down),
// then started (make local-up) with the environment's settings and the
// suite's (the binaries are built by the first Up only); needs
// NeedsSentinel or NeedsCluster starts that topology.
func (l *Local) Up(ctx context.Context, needs string) (Info, error) {
	if err := l.Down(ctx); err != nil {
		return Info{}, err
	}
	l.logsAt = map[string]int64{}
	if logs, err := filepath.Glob(filepath.Join(l.runDir, "*.log")); err == nil {
		for _, f := range logs {
			if fi, err := os.Stat(f); err == nil {
				l.logsAt[f] = fi.Size()
			}
		}
	}
	s, err := native.Load(l.r.root, os.Getenv)
	if err != nil {
		return Info{}, err
	}
	l.runDir = s.RunDir
	s.SkipBuild = s.SkipBuild || l.built
	s.Topology = native.Single
	if needs == NeedsSentinel || needs == NeedsCluster {
		s.Topology = native.Topology(needs)
	}
	if os.Getenv("LOCAL_LOG_LEVEL") == "" {
		// nginx's access log and requests.jsonl hold every request id; a
		// line per request in each app's log (local-up's default) cost
		// the apps a tenth of their CPU.
		s.LogLevel = "info"
	}
	if os.Getenv("LOCAL_PROMETHEUS") == "" {
		// Not part of what a scenario measures: its scrapes and its own
		// start would take CPU the stack under test needs.
		s.Prometheus = false
	}
	if os.Getenv("LOCAL_POLICY_FILE") == "" {
		// The load comes from one address: a per-address ceiling sized
		// for it (the demo's would refuse most of it).
		s.PolicyFile = filepath.Join(l.r.root, PolicyFile)
	}
	l.policyDir, l.rlsDir = "", ""
	if needs == NeedsReload {
		if l.policyDir, err = l.newRunDir("chaos-policies"); err != nil {
			return Info{}, err
		}
		if l.rlsDir, err = l.newRunDir("chaos-rls"); err != nil {
			return Info{}, err
		}
	}
	s.PolicyDir, s.RLSConfigPerAppDir = l.policyDir, l.rlsDir
	if os.Getenv("LOCAL_RLS_CONFIG_DIR") == "" {
		s.RLSConfigDir = filepath.Join(l.r.root, RLSConfigDir)
	}
	// clock-step moves an instance's wall clock through its admin port.
	s.DebugClock = true
	// The apps reach Redis through their fault proxies only when the fault
	// needs them: elsewhere the proxy's hop is not the deployment's (the
	// compose stack has none), and it took a sixth of a CPU under the load.
	l.direct = needs != NeedsLatency && needs != NeedsPartition && needs != NeedsResetPartition
	s.RedisDirect = l.direct
	st := native.New(l.r.root, s, l.logWriter())
	st.OnStart = l.started
	if err := st.Up(ctx); err != nil {
		return Info{}, fmt.Errorf("native stack: %w", err)
	}
	l.native = st
	l.built = true
	info, err := l.readInfo()
	if err != nil {
		return Info{}, err
	}
	if info.ProxyAPI == "" || len(info.Apps) == 0 || info.RedisPID <= 0 || len(info.RedisNodes) == 0 {
		return Info{}, fmt.Errorf("%s: incomplete: %+v", l.stackJSON(), info)
	}
	if info.Topology != string(s.Topology) {
		return Info{}, fmt.Errorf("%s: topology %q, want %q", l.stackJSON(), info.Topology, s.Topology)
	}
	l.prioritize()
	return info, nil
}

// logWriter is where the native stack's progress goes: the log, if any.
func (l *Local) logWriter() io.Writer {
	if l.r.log == nil {
		return io.Discard
	}
	return l.r.log
}

// prioritize gives the native stack's processes (those of <run>/pids/ and
// their children: nginx's workers) and this process, which generates the
// load and times it, stackNice, as the compose stack's (Compose.prioritize).
// Needs root (CAP_SYS_NICE); without it the run goes on at the default
// priority and says so once.
func (l *Local) prioritize() {
	pids := stackProcesses(filepath.Join(l.runDir, "pids"))
	pids = append(pids, os.Getpid())
	for _, pid := range pids {
		if err := renice(pid, stackNice); err != nil && !errors.Is(err, fs.ErrNotExist) {
			if !l.reniced {
				l.r.logf("local: cannot raise the stack's priority (%v): the fault injection's work competes with the requests", err)
			}
			return
		}
	}
	if !l.reniced {
		l.r.logf("local: %d processes of the stack (and the load generator) at nice %d", len(pids), stackNice)
	}
	l.reniced = true
}

// started is the native stack's OnStart: a process started once the stack
// runs at stackNice gets it at once, before it answers (Redis restarted at
// a lower priority would serve the apps' first decisions from behind
// everything else).
func (l *Local) started(_ string, pid int) {
	if l.reniced {
		_ = renice(pid, stackNice)
	}
}

// stack returns the native stack Up started, or, when this Local did not
// start it, the running one with the settings its up saved.
func (l *Local) stack() (*native.Stack, error) {
	if l.native != nil {
		return l.native, nil
	}
	s, err := native.LoadSaved(l.r.root, os.Getenv)
	if err != nil {
		return nil, err
	}
	st := native.New(l.r.root, s, l.logWriter())
	st.OnStart = l.started
	l.native = st
	return st, nil
}

// startService starts one service of the running stack (wipe: a data node
// without its data), waits until it is ready, and rereads stack.json.
func (l *Local) startService(ctx context.Context, service string, wipe bool) error {
	st, err := l.stack()
	if err != nil {
		return err
	}
	err = st.Start(ctx, service, wipe)
	// Threads and children started since (Redis' background threads are
	// created by the main thread, after its renice, but nginx's workers
	// are not the pid file's process).
	if l.reniced {
		l.prioritize()
	}
	if err != nil {
		return fmt.Errorf("start %s: %w", service, err)
	}
	_, err = l.readInfo()
	return err
}

// readInfo reads <run>/stack.json (a start rewrites it, with the new
// pids).
func (l *Local) readInfo() (Info, error) {
	info, err := ReadInfo(l.stackJSON())
	if err != nil {
		return Info{}, err
	}
	_, info.AdminToken = AdminTokens()
	l.info = info
	return info, nil
}

// Down implements Stack: make local-down. Safe to call twice.
func (l *Local) Down(context.Context) error {
	// Not ctx's: the stack must stop even when the run was interrupted.
	// Down needs the run directory and the stop timeout only.
	s, err := native.Load(l.r.root, func(k string) string {
		if k == "LOCAL_RUN_DIR" || k == "LOCAL_STOP_TIMEOUT" {
			return os.Getenv(k)
		}
		return ""
	})
	if err != nil {
		return err
	}
	l.native = nil
	return native.Down(s.RunDir, s.StopTimeout, l.logWriter())
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

// cmdline returns the command line of pid (nil if it cannot be read).
func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	var out []string
	for s := range strings.SplitSeq(strings.TrimRight(string(b), "\x00"), "\x00") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
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
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s (pid %d): %w", app, pid, err)
	}
	return nil
}

// StartRedis implements Stack: redis started again (wipe: without its
// data), as scripts/local-service.sh start redis [--wipe] does.
func (l *Local) StartRedis(ctx context.Context, wipe bool) error {
	return l.StartNode(ctx, "redis", wipe)
}

// StartApp implements Stack: the app started again, as
// scripts/local-service.sh start <app> does.
func (l *Local) StartApp(ctx context.Context, app string) error {
	return l.startService(ctx, app, false)
}

// Partition implements Stack: disables (on) or enables the app's toxiproxy
// proxy; disabling closes its connections.
func (l *Local) Partition(ctx context.Context, app string, on bool) error {
	if l.direct {
		return &UnsupportedError{Fault: NeedsPartition, Reason: "the apps dial Redis directly (Up without needs \"partition\")"}
	}
	proxy, err := l.proxyOf(app)
	if err != nil {
		return err
	}
	body := fmt.Sprintf(`{"enabled":%t}`, !on)
	return l.proxyCall(ctx, l.info.ProxyAPI, http.MethodPost, "/proxies/"+proxy, body, false)
}

// Latency implements Stack: a latency toxic on every app's proxy.
func (l *Local) Latency(ctx context.Context, d, jitter time.Duration) error {
	if l.direct {
		return &UnsupportedError{Fault: NeedsLatency, Reason: "the apps dial Redis directly (Up without needs \"latency\")"}
	}
	return l.latency(ctx, l.info, d, jitter)
}

// SetClock implements Stack, on the app's admin port.
func (l *Local) SetClock(ctx context.Context, app string, offset time.Duration) error {
	return l.setClock(ctx, l.info, app, offset)
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

// KeepLogs copies what the stack's processes wrote to their logs
// (.run/*.log) since Up into dir, so that a scenario's logs are its own
// and outlive the next scenario's stack, which appends to the same files.
// Call it after Down: the processes have flushed their logs.
func (l *Local) KeepLogs(dir string) error {
	logs, err := filepath.Glob(filepath.Join(l.runDir, "*.log"))
	if err != nil || len(logs) == 0 {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, src := range logs {
		b, err := os.ReadFile(src)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if at := l.logsAt[src]; at <= int64(len(b)) {
			b = b[at:] // else the file was started again: all of it is this stack's
		}
		if len(b) == 0 {
			continue
		}
		errs = append(errs, os.WriteFile(filepath.Join(dir, filepath.Base(src)), b, 0o644))
	}
	return errors.Join(errs...)
}
