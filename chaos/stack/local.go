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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Local is the native stack of `make local-up`.
//
// Processes are restarted with scripts/local-service.sh, which starts a
// service with the settings local-up.sh used and keeps .run/pids/ and
// .run/stack.json current, so `make local-down` still stops everything.
//
// Local is not safe for concurrent use.
type Local struct {
	httpAPI
	r     runner
	built bool
	info  Info
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
	tokens, _ := AdminTokens()
	return &Local{
		httpAPI: newHTTPAPI(),
		r:       runner{root: root, log: log, env: []string{"RL_ADMIN_TOKEN=" + tokens}},
	}
}

// Name implements Stack.
func (l *Local) Name() string { return "local" }

// Unsupported implements Stack: the native stack injects every fault and
// runs every topology.
func (l *Local) Unsupported(string) string { return "" }

func (l *Local) stackJSON() string { return filepath.Join(l.r.root, ".run", "stack.json") }

func (l *Local) serviceScript() string { return filepath.Join(l.r.root, "scripts", "local-service.sh") }

// Up implements Stack: make local-down, then make local-up (the binaries are
// built by the first Up only), then reads .run/stack.json. needs
// NeedsSentinel or NeedsCluster starts that topology (LOCAL_TOPOLOGY).
func (l *Local) Up(ctx context.Context, needs string) (Info, error) {
	if err := l.r.run(ctx, "make", "--no-print-directory", "local-down"); err != nil {
		return Info{}, err
	}
	l.logsAt = map[string]int64{}
	if logs, err := filepath.Glob(filepath.Join(l.r.root, ".run", "*.log")); err == nil {
		for _, f := range logs {
			if fi, err := os.Stat(f); err == nil {
				l.logsAt[f] = fi.Size()
			}
		}
	}
	r := l.r
	r.env = slices.Clone(r.env)
	if l.built {
		r.env = append(r.env, "LOCAL_SKIP_BUILD=1")
	}
	topology := "single"
	if needs == NeedsSentinel || needs == NeedsCluster {
		topology = needs
	}
	r.env = append(r.env, "LOCAL_TOPOLOGY="+topology)
	if os.Getenv("LOCAL_LOG_LEVEL") == "" {
		// nginx's access log and requests.jsonl hold every request id; a
		// line per request in each app's log (local-up's default) cost
		// the apps a tenth of their CPU.
		r.env = append(r.env, "LOCAL_LOG_LEVEL=info")
	}
	if os.Getenv("LOCAL_PROMETHEUS") == "" {
		// Not part of what a scenario measures: its scrapes and its own
		// start would take CPU the stack under test needs.
		r.env = append(r.env, "LOCAL_PROMETHEUS=0")
	}
	if os.Getenv("LOCAL_POLICY_FILE") == "" {
		// The load comes from one address: a per-address ceiling sized
		// for it (the demo's would refuse most of it).
		r.env = append(r.env, "LOCAL_POLICY_FILE="+filepath.Join(l.r.root, PolicyFile))
	}
	l.policyDir, l.rlsDir = "", ""
	if needs == NeedsReload {
		dir, err := l.newRunDir("chaos-policies")
		if err != nil {
			return Info{}, err
		}
		l.policyDir = dir
		r.env = append(r.env, "LOCAL_POLICY_DIR="+dir)
		if dir, err = l.newRunDir("chaos-rls"); err != nil {
			return Info{}, err
		}
		l.rlsDir = dir
		r.env = append(r.env, "LOCAL_RLS_CONFIG_PER_APP_DIR="+dir)
	}
	if os.Getenv("LOCAL_RLS_CONFIG_DIR") == "" {
		r.env = append(r.env, "LOCAL_RLS_CONFIG_DIR="+filepath.Join(l.r.root, RLSConfigDir))
	}
	// clock-step moves an instance's wall clock through its admin port.
	r.env = append(r.env, "RL_DEBUG_CLOCK=true")
	// The apps reach Redis through their fault proxies only when the fault
	// needs them: elsewhere the proxy's hop is not the deployment's (the
	// compose stack has none), and it took a sixth of a CPU under the load.
	l.direct = needs != NeedsLatency && needs != NeedsPartition && needs != NeedsResetPartition
	if l.direct {
		r.env = append(r.env, "LOCAL_REDIS_DIRECT=1")
	} else {
		r.env = append(r.env, "LOCAL_REDIS_DIRECT=0")
	}
	if err := r.run(ctx, "make", "--no-print-directory", "local-up"); err != nil {
		return Info{}, err
	}
	l.built = true
	info, err := l.readInfo()
	if err != nil {
		return Info{}, err
	}
	if info.ProxyAPI == "" || len(info.Apps) == 0 || info.RedisPID <= 0 || len(info.RedisNodes) == 0 {
		return Info{}, fmt.Errorf("%s: incomplete: %+v", l.stackJSON(), info)
	}
	if info.Topology != topology {
		return Info{}, fmt.Errorf("%s: topology %q, want %q", l.stackJSON(), info.Topology, topology)
	}
	l.prioritize()
	return info, nil
}

// prioritize gives the native stack's processes (those of .run/pids/ and
// their children: nginx's workers) and this process, which generates the
// load and times it, stackNice, as the compose stack's (Compose.prioritize).
// A restart by local-service.sh (a shell, its subshells, redis-cli probes,
// stack.json rewritten) takes CPU at the moment the apps reconnect and
// replay; at the stack's priority nginx and the load generator would wait
// for it (nginx's access log against requests.jsonl shows where the time
// goes). Needs root
// (CAP_SYS_NICE); without it the run goes on at the default priority and
// says so once.
func (l *Local) prioritize() {
	pids := stackProcesses(filepath.Join(l.r.root, ".run", "pids"))
	pids = append(pids, os.Getpid())
	for _, pid := range pids {
		if err := renice(pid, stackNice); err != nil && !errors.Is(err, fs.ErrNotExist) {
			if !l.reniced {
				l.r.logf("local: cannot raise the stack's priority (%v): the fault injection's shell work competes with the requests", err)
			}
			return
		}
	}
	if !l.reniced {
		l.r.logf("local: %d processes of the stack (and the load generator) at nice %d", len(pids), stackNice)
	}
	l.reniced = true
}

// runService runs local-service.sh args at scriptNice, and gives the
// process it starts for service (its pid file changes) stackNice as soon
// as it appears, before it answers: Redis restarted at the script's
// priority would serve the apps' first decisions from behind everything
// else.
func (l *Local) runService(ctx context.Context, service string, args ...string) error {
	if !l.reniced {
		return l.r.run(ctx, l.serviceScript(), args...)
	}
	pidFile := filepath.Join(l.r.root, ".run", "pids", service+".pid")
	old, _ := os.ReadFile(pidFile)
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			b, err := os.ReadFile(pidFile)
			if err != nil || bytes.Equal(b, old) {
				continue
			}
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				_ = renice(pid, stackNice)
				return
			}
		}
	}()
	nice := scriptNice
	err := l.r.runAt(ctx, &nice, l.serviceScript(), args...)
	close(done)
	<-watched
	// Threads and children started since (Redis' background threads are
	// created by the main thread, after its renice, but nginx's workers
	// are not the pid file's process).
	l.prioritize()
	return err
}

// readInfo reads .run/stack.json (local-service.sh rewrites it after each
// restart, with the new pids).
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
func (l *Local) Down(ctx context.Context) error {
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

// StartRedis implements Stack: scripts/local-service.sh start redis
// (--wipe: without its data).
func (l *Local) StartRedis(ctx context.Context, wipe bool) error {
	return l.StartNode(ctx, "redis", wipe)
}

// StartApp implements Stack: scripts/local-service.sh start <app>.
func (l *Local) StartApp(ctx context.Context, app string) error {
	if err := l.runService(ctx, app, "start", app); err != nil {
		return err
	}
	_, err := l.readInfo()
	return err
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
	logs, err := filepath.Glob(filepath.Join(l.r.root, ".run", "*.log"))
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
