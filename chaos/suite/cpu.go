package suite

// The machine's CPU use per phase, from Linux's /proc/stat: how busy the
// cores were and how much time the hypervisor took from this machine
// (steal). A latency bound that fails in a phase with steal measures the
// host as much as the stack; the report says which it was.

import (
	"math"
	"os"
	"strconv"
	"strings"
)

// cpuTimes are the machine's CPU time counters, in clock ticks.
type cpuTimes struct{ busy, steal, total uint64 }

// readCPU reads the first line of /proc/stat: user nice system idle iowait
// irq softirq steal (guest time is part of user). ok is false where there
// is no such file.
func readCPU() (t cpuTimes, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return t, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return t, false
	}
	var v [8]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
			return t, false
		}
		t.total += v[i]
	}
	t.busy = v[0] + v[1] + v[2] + v[5] + v[6]
	t.steal = v[7]
	return t, true
}

// percents returns the busy and steal shares of the machine's CPU time
// between a and b, in percent (one decimal); NaN without ticks between.
func percents(a, b cpuTimes) (busy, steal float64) {
	total := float64(b.total - a.total)
	if b.total <= a.total {
		return math.NaN(), math.NaN()
	}
	round := func(x float64) float64 { return math.Round(x*1000/total) / 10 }
	return round(float64(b.busy - a.busy)), round(float64(b.steal - a.steal))
}
