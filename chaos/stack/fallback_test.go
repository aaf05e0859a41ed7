package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestFallbackRestart: without scripts/local-service.sh, a killed app is
// started again from its /proc command line, environment and working
// directory, and Down stops it.
func TestFallbackRestart(t *testing.T) {
	sleepBin, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc")
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, ".run"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A stand-in app: sleep, under a name that contains "ratelimiter".
	bin := filepath.Join(root, "ratelimiter")
	b, err := os.ReadFile(sleepBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	workdir := t.TempDir()
	orig := exec.Command(bin, "300")
	orig.Dir = workdir
	orig.Env = []string{"RL_INSTANCE=app1", "MARK=fallback-test"}
	if err := orig.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = orig.Process.Kill(); _ = orig.Wait() })

	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer admin.Close()
	info := Info{Apps: []App{{Name: "app1", AdminURL: admin.URL, PID: orig.Process.Pid}}}
	js, _ := json.Marshal(info)
	if err := os.WriteFile(filepath.Join(root, ".run", "stack.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}

	l := NewLocal(root, io.Discard)
	ctx := context.Background()
	if _, err := l.readInfo(); err != nil {
		t.Fatal(err)
	}
	if err := l.KillApp(ctx, "app1"); err != nil {
		t.Fatal(err)
	}
	_ = orig.Wait() // reap it
	if err := l.StartApp(ctx, "app1"); err != nil {
		t.Fatal(err)
	}
	if len(l.spawned) != 1 {
		t.Fatalf("%d processes spawned", len(l.spawned))
	}
	pid := l.spawned[0].Process.Pid
	spec, err := readProc(pid)
	if err != nil {
		t.Fatal(err)
	}
	if spec.dir != workdir || fmt.Sprint(spec.args) != fmt.Sprint([]string{bin, "300"}) || fmt.Sprint(spec.env) != fmt.Sprint(orig.Env) {
		t.Errorf("restarted as %+v", spec)
	}
	if l.info.Apps[0].PID != pid {
		t.Errorf("pid not updated: %d, want %d", l.info.Apps[0].PID, pid)
	}
	_ = l.Down(ctx) // make local-down fails here (no Makefile); the spawned process must stop anyway
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("pid %d still runs after Down", pid)
	}
}
