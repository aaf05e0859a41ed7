package main

import (
	"math"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestProcCPU: the CPU time read from /proc/<pid>/stat is this process'
// and grows while it spins; a pid that does not exist is no reading.
func TestProcCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/<pid>/stat is Linux's")
	}
	pid := os.Getpid()
	before, ok := procCPU([]int{pid})
	if !ok {
		t.Fatal("no reading of this process")
	}
	// Spin until the reading shows 50 ms more CPU, for at most 10 s.
	grew := false
	for start, x := time.Now(), 0; !grew && time.Since(start) < 10*time.Second; x++ {
		if x%1_000_000 == 0 {
			now, ok := procCPU([]int{pid})
			if !ok {
				t.Fatal("the reading failed")
			}
			grew = now >= before+50_000
		}
	}
	if !grew {
		t.Fatal("10 s of spinning did not show 50 ms of CPU")
	}
	if _, ok := procCPU([]int{pid, 1 << 30}); ok {
		t.Error("a reading with a pid that does not exist")
	}
	if _, err := parsePids("12, 34"); err != nil {
		t.Error(err)
	}
	if _, err := parsePids("12,x"); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("parsePids(12,x): %v, want an error naming x", err)
	}
}

// TestCostRatios: the cost ratios and the sizing come from the rows they
// name: the mean of the script CPU rounds, the stack's added CPU per
// request (apps and Redis, on minus off), and masters at 60 % busy.
func TestCostRatios(t *testing.T) {
	res := Results{Ratios: map[string]float64{},
		ScriptCPU: []ScriptCPURow{
			{Name: "script-cpu/ours-gcra-P1", Rounds: []float64{8, 9}},
			{Name: "script-cpu/peer-redis_rate-P1", Rounds: []float64{6, 7}},
		},
		Memory: []MemRow{
			{Name: "memory/ours/gcra", Keys: 200_000, UsedMemoryPerKey: 190},
			{Name: "memory/peer/redis_rate", Keys: 200_000, UsedMemoryPerKey: 165},
		},
		Rows: []Row{
			{Name: "stack/limiter-on", Goroutines: 64, DecisionsPerS: 1, AppCPUus: 150, RedisCPUus: 40},
			{Name: "stack/limiter-off", Goroutines: 64, DecisionsPerS: 1, AppCPUus: 80, RedisCPUus: 1},
			{Name: "cluster/gcra-3-masters", Goroutines: 64, DecisionsPerS: 1, RedisCPUus: 40, BenchCPUus: 30},
		},
	}
	costRatios(&res)
	for k, want := range map[string]float64{
		"script_cpu_ours_vs_redis_rate_P1":       1.308,
		"memory_gcra_bytes_per_key":              190,
		"memory_gcra_vs_redis_rate":              1.152,
		"stack_limiter_cpu_us_per_request_at_64": 109,
	} {
		if got := res.Ratios[k]; math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	// 100 000/s × 40 µs = 4 cores: 7 masters at 60 %; 10 M × (190 + 16 + 6) B.
	s := sizingText(res)
	for _, want := range []string{"| 100000 decisions/s | 4.0 cores: 7 masters | 2.1 GB", "| 3.0 cores |"} {
		if !strings.Contains(s, want) {
			t.Errorf("sizing lacks %q:\n%s", want, s)
		}
	}
}
