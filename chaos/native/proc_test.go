package native

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary a stand-in for a service's program
// (TestMain): "sleep" waits to be signalled, "ignore-term" ignores TERM.
const helperEnv = "NATIVE_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "sleep":
		time.Sleep(time.Minute)
		os.Exit(0)
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ignoring TERM")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// program returns a path under which the test binary runs as program (a
// symlink named so), for the guard's command-line check.
func program(t *testing.T, name string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), name)
	if err := os.Symlink(exe, link); err != nil {
		t.Fatal(err)
	}
	return link
}

func testStack(t *testing.T, run string) (*Stack, *bytes.Buffer) {
	t.Helper()
	var log bytes.Buffer
	s, err := load(testLoader(fakeRoot(t), false), env("LOCAL_RUN_DIR="+run, "REDIS_PASSWORD=p@ss word"))
	if err != nil {
		t.Fatal(err)
	}
	st := New(s.RunDir, s, &log)
	st.now = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
	return st, &log
}

// TestServicePID: a pid file counts only while it names a live process,
// not a zombie, whose command line is the service's program.
func TestServicePID(t *testing.T) {
	run := t.TempDir()
	if err := os.MkdirAll(filepath.Join(run, pidDir), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(pidFile(run, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(program(t, "ratelimiter"))
	cmd.Env = append(os.Environ(), helperEnv+"=sleep")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	live := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zombie.Wait() })
	waitUntil(t, "true exits", func() bool { return strings.Contains(stat(zombie.Process.Pid), ") Z") }) // not reaped

	for _, tc := range []struct {
		name, file string
		want       int
	}{
		{"app1", strconv.Itoa(live) + "\n", live},
		{"app2", strconv.Itoa(live), live},
		{"redis", strconv.Itoa(live) + "\n", 0},       // alive, but not redis-server: a reused pid
		{"app3", strconv.Itoa(zombie.Process.Pid), 0}, // a zombie
		{"app4", "12ab", 0},
		{"nginx", "", 0},
		{"static", "0", 0},
		{"toxiproxy", "2147483647", 0}, // no such process
	} {
		write(tc.name, tc.file)
		if got := ServicePID(run, tc.name); got != tc.want {
			t.Errorf("%s with pid file %q: %d, want %d", tc.name, tc.file, got, tc.want)
		}
	}
	if got := ServicePID(run, "prometheus"); got != 0 {
		t.Errorf("no pid file: %d", got)
	}
}

// waitUntil polls cond until it holds, failing the test after 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
	}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func stat(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return string(b)
}

// session is a process's session id: pid (comm) state ppid pgrp session.
func session(pid int) int {
	s := stat(pid)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 4 {
		return 0
	}
	n, _ := strconv.Atoi(f[3])
	return n
}

// TestSpawnAndStop: spawn starts a process in its own session with its
// output in <run>/<name>.log after the header (the password masked) and
// its pid file; stop TERMs it, KILLs one that ignores TERM after the
// timeout, and removes the pid files.
func TestSpawnAndStop(t *testing.T) {
	run := t.TempDir()
	st, log := testStack(t, run)
	var started []string
	st.OnStart = func(name string, pid int) { started = append(started, fmt.Sprintf("%s %d", name, pid)) }
	prog := program(t, "ratelimiter")
	pass := st.s.RedisPassword
	pid1, err := st.spawn("app1", command{argv: []string{prog, "--url", "redis://:" + urlEncode(pass) + "@h/0"},
		env: []string{helperEnv + "=sleep", "RL_ADMIN_TOKEN=tok", "RL_REDIS_PASSWORD=" + pass}, unset: []string{"RL_REDIS_URL"}})
	if err != nil {
		t.Fatal(err)
	}
	pid2, err := st.spawn("app2", command{argv: []string{prog}, env: []string{helperEnv + "=ignore-term"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{fmt.Sprintf("app1 %d", pid1), fmt.Sprintf("app2 %d", pid2)}; strings.Join(started, ",") != strings.Join(want, ",") {
		t.Errorf("OnStart calls %v, want %v", started, want)
	}
	if ServicePID(run, "app1") != pid1 || ServicePID(run, "app2") != pid2 {
		t.Fatalf("pids %d %d, want %d %d", ServicePID(run, "app1"), ServicePID(run, "app2"), pid1, pid2)
	}
	if sid := session(pid1); sid != pid1 {
		t.Errorf("app1's session %d, want its own (%d)", sid, pid1)
	}
	b, _ := os.ReadFile(filepath.Join(run, "app1.log"))
	wantHeader := "==== 2026-01-02T03:04:05Z  app1 starting: env -u RL_REDIS_URL " + helperEnv + "=sleep RL_ADMIN_TOKEN=*** RL_REDIS_PASSWORD=*** " +
		prog + " --url redis://:***@h/0\n"
	if string(b) != wantHeader {
		t.Errorf("app1.log:\n%q\nwant\n%q", b, wantHeader)
	}

	waitUntil(t, "app2 ignores TERM", func() bool { return strings.Contains(readFile(filepath.Join(run, "app2.log")), "ignoring TERM") })

	// A stray pid file of a process that is not ours is only reported.
	if err := os.WriteFile(pidFile(run, "app3"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop(run, 300*time.Millisecond, log, "app1", "app2", "app3", "app4")
	if d := time.Since(start); d < 300*time.Millisecond || d > 5*time.Second {
		t.Errorf("stop took %v: want the timeout, then KILL", d)
	}
	out := log.String()
	for _, want := range []string{
		"  app3: was not running\n",
		fmt.Sprintf("  app2 (pid %d) ignored TERM for 300ms: KILL\n", pid2),
		fmt.Sprintf("  app1 (pid %d) stopped\n  app2 (pid %d) stopped\n", pid1, pid2),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stop's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "app1 (pid "+strconv.Itoa(pid1)+") ignored") {
		t.Errorf("app1 exits on TERM:\n%s", out)
	}
	for _, n := range []string{"app1", "app2", "app3"} {
		if _, err := os.Stat(pidFile(run, n)); err == nil {
			t.Errorf("%s's pid file is left", n)
		}
	}
	for _, pid := range []int{pid1, pid2} {
		waitUntil(t, fmt.Sprintf("pid %d is gone after stop", pid), func() bool { return !running(pid) })
	}
}

// TestDown: with no pid files Down says so and removes stack.json and
// stack.env; otherwise it leaves the pid files of what is not a service.
func TestDown(t *testing.T) {
	run := t.TempDir()
	for _, f := range []string{stackJSON, stackEnv} {
		if err := os.WriteFile(filepath.Join(run, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var log bytes.Buffer
	if err := Down(run, time.Second, &log); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "nothing to stop") {
		t.Errorf("Down: %q", log.String())
	}
	for _, f := range []string{stackJSON, stackEnv} {
		if _, err := os.Stat(filepath.Join(run, f)); err == nil {
			t.Errorf("%s left", f)
		}
	}
	if err := os.MkdirAll(filepath.Join(run, pidDir), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"mine", "redis3"} {
		if err := os.WriteFile(pidFile(run, n), []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log.Reset()
	if err := Down(run, time.Second, &log); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "left alone (not a service of the native stack): mine.pid") ||
		!strings.Contains(log.String(), "redis3: was not running") {
		t.Errorf("Down: %q", log.String())
	}
	if _, err := os.Stat(pidFile(run, "mine")); err != nil {
		t.Error("Down removed the pid file of something that is not its")
	}
}

func TestURLEncode(t *testing.T) {
	if got := urlEncode("a-Z_0.~ @:/%é"); got != "a-Z_0.~%20%40%3A%2F%25%C3%A9" {
		t.Errorf("urlEncode: %q", got)
	}
}
