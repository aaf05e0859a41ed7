package stack

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestProcViews(t *testing.T) {
	self := os.Getpid()
	if pp, err := ppid(self); err != nil || pp != os.Getppid() {
		t.Errorf("ppid(self) = %d, %v; want %d", pp, err, os.Getppid())
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	if got := pidsNamed(strings.TrimSpace(string(comm))); !slices.Contains(got, self) {
		t.Errorf("pidsNamed(%q) = %v, want it to hold %d", comm, got, self)
	}
	// Setting the nice value it already has needs no privilege.
	nice, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := renice(self, 20-nice); err != nil { // Getpriority returns 20 - nice
		t.Errorf("renice to the current value: %v", err)
	}
	if _, _, err := containerPIDs("0123456789abcdef0123456789abcdef"); err == nil {
		t.Error("containerPIDs of an id no cgroup names: no error")
	}
	// This process's own cgroup, as a container's would be named.
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	name := ""
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if n := filepath.Base(line[strings.LastIndexByte(line, ':')+1:]); len(n) >= 12 {
			name = n
		}
	}
	if name == "" {
		t.Logf("cgroups %q: no name long enough to stand for a container id; the positive case is not checked", b)
		return
	}
	if pids, _, _ := containerPIDs(name); !slices.Contains(pids, self) {
		t.Errorf("containerPIDs(%q) = %v; want it to hold %d", name, pids, self)
	}
}
