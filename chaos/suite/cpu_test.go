package suite

import (
	"math"
	"runtime"
	"testing"
)

func TestPercents(t *testing.T) {
	a := cpuTimes{busy: 100, steal: 10, total: 1000}
	b := cpuTimes{busy: 700, steal: 60, total: 2000}
	if busy, steal := percents(a, b); busy != 60 || steal != 5 {
		t.Errorf("percents = %v, %v; want 60, 5", busy, steal)
	}
	if busy, _ := percents(b, b); !math.IsNaN(busy) {
		t.Errorf("no ticks between: %v, want NaN", busy)
	}
}

func TestReadCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/stat is Linux's")
	}
	a, ok := readCPU()
	if !ok || a.total == 0 || a.busy > a.total || a.steal > a.total {
		t.Fatalf("readCPU = %+v, %v", a, ok)
	}
}
