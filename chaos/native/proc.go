package native

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The run directory's files.
const (
	pidDir    = "pids"
	stackEnv  = "stack.env"
	stackJSON = "stack.json"
)

func pidFile(runDir, name string) string { return filepath.Join(runDir, pidDir, name+".pid") }

// expectedCmd is what a service's command line must contain for a recorded
// pid to still be ours.
func expectedCmd(name string) string {
	switch {
	case strings.HasPrefix(name, "redis"), strings.HasPrefix(name, "sentinel"):
		return "redis-server"
	case name == "toxiproxy":
		return "toxiproxy-server"
	case name == "nginx", name == "static":
		return "nginx"
	case strings.HasPrefix(name, "app"):
		return "ratelimiter"
	case name == "prometheus":
		return "prometheus"
	}
	return ""
}

// running reports whether pid is alive and not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndex(b, []byte(") "))
	return i >= 0 && len(b) > i+2 && b[i+2] != 'Z'
}

// runs reports whether pid is alive, not a zombie, and its command line
// contains want: the guard against a pid reused by another program.
func runs(pid int, want string) bool {
	if pid <= 0 || want == "" || !running(pid) {
		return false
	}
	path := fmt.Sprintf("/proc/%d/cmdline", pid)
	for range 50 {
		cmdline, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		// A process that rewrites its title (nginx, redis-server) shows
		// an empty command line for a moment while it does: read again.
		if len(cmdline) > 0 {
			return bytes.Contains(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), []byte(want))
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

// ServicePID returns the pid of service name of the stack in runDir when
// its pid file names a live process that is still the program the stack
// started; 0 otherwise.
func ServicePID(runDir, name string) int {
	b, err := os.ReadFile(pidFile(runDir, name))
	if err != nil {
		return 0
	}
	s := strings.TrimSpace(string(b))
	pid, err := strconv.Atoi(s)
	if err != nil || strconv.Itoa(pid) != s || !runs(pid, expectedCmd(name)) {
		return 0
	}
	return pid
}

// command is a process to start: argv, the environment to add (over the
// caller's, from which unset is removed) and how the log describes it.
type command struct {
	argv  []string
	env   []string // NAME=value
	unset []string
}

// environ is the caller's environment without c.unset and the names c.env
// sets, then c.env.
func (c command) environ() []string {
	drop := slices.Clone(c.unset)
	for _, kv := range c.env {
		name, _, _ := strings.Cut(kv, "=")
		drop = append(drop, name)
	}
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(drop, name) {
			out = append(out, kv)
		}
	}
	return append(out, c.env...)
}

// describe is the command line the log shows: env -u ... NAME=value ...
// argv, with secrets masked.
func (c command) describe(password string, secretVars ...string) string {
	var parts []string
	if len(c.env) > 0 || len(c.unset) > 0 {
		parts = append(parts, "env")
		for _, u := range c.unset {
			parts = append(parts, "-u", u)
		}
		for _, kv := range c.env {
			name, _, _ := strings.Cut(kv, "=")
			if slices.Contains(secretVars, name) {
				kv = name + "=***"
			}
			parts = append(parts, kv)
		}
	}
	desc := strings.Join(append(parts, c.argv...), " ")
	if password != "" { // keep the password out of the log
		desc = strings.ReplaceAll(desc, urlEncode(password), "***")
		desc = strings.ReplaceAll(desc, password, "***")
	}
	return desc
}

// spawn starts c as service name in the background, in its own session (so
// that a Ctrl-C in the terminal that ran `make local-up` later does not
// reach it), stdin /dev/null, stdout and stderr appended to
// <run>/<name>.log after a "==== <time>  <name> starting: <command>" line,
// its pid in <run>/pids/<name>.pid. A goroutine reaps it when it exits
// (while this process lives: a command's children outlive it).
func (st *Stack) spawn(name string, c command) (int, error) {
	st.spawned = append(st.spawned, name)
	run := st.s.RunDir
	if err := os.MkdirAll(filepath.Join(run, pidDir), 0o755); err != nil {
		return 0, err
	}
	logf, err := os.OpenFile(filepath.Join(run, name+".log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	desc := c.describe(st.s.RedisPassword, "RL_API_KEY_SECRET", "RL_ADMIN_TOKEN", "RL_REDIS_PASSWORD")
	fmt.Fprintf(logf, "==== %s  %s starting: %s\n", st.now().UTC().Format("2006-01-02T15:04:05Z"), name, desc)
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	p, err := os.StartProcess(c.argv[0], c.argv, &os.ProcAttr{
		Env:   c.environ(),
		Files: []*os.File{null, logf, logf},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		fmt.Fprintf(logf, "%s: %v\n", c.argv[0], err)
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	go func() { _, _ = p.Wait() }()
	if err := writeFile(pidFile(run, name), []byte(strconv.Itoa(p.Pid)+"\n"), 0o644); err != nil {
		return p.Pid, err
	}
	if st.OnStart != nil {
		st.OnStart(name, p.Pid)
	}
	return p.Pid, nil
}

// stop stops names: TERM each (plus CONT, in case the chaos suite
// SIGSTOPped it), waits up to the stop timeout for all of them, then KILLs
// what is left. Only pids recorded in <run>/pids/ are touched; their pid
// files are removed.
func stop(runDir string, timeout time.Duration, log io.Writer, names ...string) {
	type proc struct {
		name string
		pid  int
	}
	var procs []proc
	for _, name := range names {
		if pid := ServicePID(runDir, name); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGTERM)
			_ = syscall.Kill(pid, syscall.SIGCONT)
			procs = append(procs, proc{name, pid})
		} else if _, err := os.Stat(pidFile(runDir, name)); err == nil {
			fmt.Fprintf(log, "  %s: was not running\n", name)
		}
	}
	alive := func() bool {
		return slices.ContainsFunc(procs, func(p proc) bool { return running(p.pid) })
	}
	deadline := time.Now().Add(timeout)
	for alive() {
		if !time.Now().Before(deadline) {
			for _, p := range procs {
				if running(p.pid) {
					fmt.Fprintf(log, "  %s (pid %d) ignored TERM for %v: KILL\n", p.name, p.pid, timeout)
					_ = syscall.Kill(p.pid, syscall.SIGKILL)
				}
			}
			time.Sleep(200 * time.Millisecond)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range procs {
		fmt.Fprintf(log, "  %s (pid %d) stopped\n", p.name, p.pid)
	}
	for _, name := range names {
		_ = os.Remove(pidFile(runDir, name))
	}
}

// stopAll stops every service any topology has: the front first, Redis
// last (the apps may talk to Redis on the way out); the Sentinels before
// the data nodes, so that they do not start a failover meanwhile.
func stopAll(runDir string, timeout time.Duration, log io.Writer) {
	stop(runDir, timeout, log, append([]string{"prometheus", "nginx", "static"}, Apps...)...)
	stop(runDir, timeout, log, allSentinels...)
	stop(runDir, timeout, log, append([]string{"toxiproxy"}, allRedisNodes...)...)
}

// Down stops the stack in runDir (LOCAL_RUN_DIR, RunDir): only the
// processes whose pid files <run>/pids/ holds and that are still the
// programs it started, TERM, up to timeout (LOCAL_STOP_TIMEOUT), then
// KILL. It removes the pid files, stack.json and stack.env, and keeps the
// logs and the data. Whatever topology the stack has, it stops every data
// node and Sentinel that left a pid file. It needs no other setting.
func Down(runDir string, timeout time.Duration, log io.Writer) error {
	files, _ := filepath.Glob(filepath.Join(runDir, pidDir, "*.pid"))
	clean := func() error {
		return errors.Join(removeIfAny(filepath.Join(runDir, stackJSON)), removeIfAny(filepath.Join(runDir, stackEnv)))
	}
	if len(files) == 0 {
		fmt.Fprintf(log, "native stack: nothing to stop (no pid files in %s/)\n", filepath.Join(runName(runDir), pidDir))
		return clean()
	}
	fmt.Fprintln(log, "stopping the native stack")
	known := append(append(append([]string{"toxiproxy", "static", "nginx", "prometheus"}, Apps...), allRedisNodes...), allSentinels...)
	var others []string
	for _, f := range files {
		if n := strings.TrimSuffix(filepath.Base(f), ".pid"); !slices.Contains(known, n) {
			others = append(others, n+".pid")
		}
	}
	stop(runDir, timeout, log, append([]string{"prometheus", "nginx", "static"}, Apps...)...)
	if len(others) > 0 {
		fmt.Fprintf(log, "  left alone (not a service of the native stack): %s\n", strings.Join(others, " "))
	}
	stop(runDir, timeout, log, allSentinels...) // before the data nodes: no failover while they stop
	stop(runDir, timeout, log, append([]string{"toxiproxy"}, allRedisNodes...)...)
	if err := clean(); err != nil {
		return err
	}
	fmt.Fprintf(log, "native stack stopped (logs kept in %s/)\n", runName(runDir))
	return nil
}

// runName is how Down's messages name the run directory: .run, else its
// path.
func runName(runDir string) string {
	if filepath.Base(runDir) == ".run" {
		return ".run"
	}
	return runDir
}

func removeIfAny(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// writeFile writes a file whole: into path.tmp, then renamed over path.
func writeFile(path string, b []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, perm); err != nil {
		return err
	}
	if err := os.Chmod(tmp, perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// FindBin returns the path of program name: from PATH, else from the sbin
// directories an ordinary user's PATH lacks (Debian puts nginx and
// redis-server there).
func FindBin(name string) (string, bool) {
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	for _, d := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/bin", "/usr/local/bin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// urlEncode percent-encodes s for the userinfo part of a URL.
func urlEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(".~_-", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
