package loadtest

import (
	"math"
	"runtime"
	"testing"
)

func TestCPUPercents(t *testing.T) {
	a := CPUTimes{Busy: 100, Steal: 10, Total: 1000}
	b := CPUTimes{Busy: 700, Steal: 60, Total: 2000}
	if busy, steal := CPUPercents(a, b); busy != 60 || steal != 5 {
		t.Errorf("percents = %v, %v; want 60, 5", busy, steal)
	}
	if busy, _ := CPUPercents(b, b); !math.IsNaN(busy) {
		t.Errorf("no ticks between: %v, want NaN", busy)
	}
}

func TestReadCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/stat is Linux's")
	}
	a, ok := ReadCPU()
	if !ok || a.Total == 0 || a.Busy > a.Total || a.Steal > a.Total {
		t.Fatalf("ReadCPU = %+v, %v", a, ok)
	}
}
