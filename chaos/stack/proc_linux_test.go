package stack

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// stackProcesses finds a pid file's process and its children (nginx's
// workers are not in a pid file), and skips a pid file whose process is gone.
func TestStackProcessesIncludesChildren(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	parent := cmd.Process.Pid
	if err := os.WriteFile(filepath.Join(dir, "svc.pid"), []byte(strconv.Itoa(parent)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gone.pid"), []byte("999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var pids []int
	for range 100 { // the shell forks its child shortly after it starts
		if pids = stackProcesses(dir); len(pids) >= 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(pids) != 2 || pids[0] != parent {
		t.Fatalf("stackProcesses = %v, want %d and its child", pids, parent)
	}
	if slices.Contains(pids, 999999999) {
		t.Fatalf("stackProcesses = %v: holds a pid that does not run", pids)
	}
}
