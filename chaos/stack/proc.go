package stack

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Host-side views of the compose stack's processes, read from /proc, so that
// faults and priorities need no docker CLI call (each costs a burst of CPU
// in the CLI, dockerd and containerd just when latency is measured).

// containerPIDs returns the host pids of the processes in the container
// whose full id is id (every process whose cgroup path names it), and the
// first of them (its parent is not in the container).
func containerPIDs(id string) (pids []int, first int, err error) {
	if len(id) < 12 {
		return nil, 0, fmt.Errorf("container id %q too short", id)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, 0, err
	}
	in := map[int]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(b), id) {
			continue
		}
		pids = append(pids, pid)
		in[pid] = true
	}
	for _, pid := range pids {
		if pp, err := ppid(pid); err == nil && !in[pp] {
			first = pid
			break
		}
	}
	if first == 0 {
		return pids, 0, fmt.Errorf("container %.12s: no running process", id)
	}
	return pids, first, nil
}

// ppid reads a process's parent from /proc/<pid>/stat.
func ppid(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("odd /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, errors.New("odd /proc stat")
	}
	return strconv.Atoi(f[1])
}

// pidsNamed returns the pids whose /proc/<pid>/comm is name.
func pidsNamed(name string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); err == nil && strings.TrimSpace(string(b)) == name {
			out = append(out, pid)
		}
	}
	return out
}

// stackProcesses returns the pids recorded in dir's *.pid files that run,
// and their children.
func stackProcesses(dir string) []int {
	files, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
	own := map[int]bool{}
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || own[pid] {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			continue
		}
		own[pid] = true
		out = append(out, pid)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || own[pid] {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 {
			if ppid, err := strconv.Atoi(f[1]); err == nil && own[ppid] {
				out = append(out, pid)
			}
		}
	}
	return out
}

// renice sets the nice value of every thread of pid (Linux keeps one per
// thread; threads started later inherit their creator's).
func renice(pid, nice int) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	var first error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil && first == nil && !errors.Is(err, syscall.ESRCH) {
			first = err
		}
	}
	return first
}
