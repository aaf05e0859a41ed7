package loadtest

// The machine's CPU use over an interval, from Linux's /proc/stat: how busy
// the cores were and how much time the hypervisor took from this machine
// (steal). A latency measured while the host steals measures the host as
// much as the code; the chaos reports (per phase) and make bench (per run)
// say which it was.

import (
	"math"
	"os"
	"strconv"
	"strings"
)

// CPUTimes are the machine's CPU time counters, in clock ticks.
type CPUTimes struct{ Busy, Steal, Total uint64 }

// ReadCPU reads the first line of /proc/stat: user nice system idle iowait
// irq softirq steal (guest time is part of user). ok is false where there
// is no such file.
func ReadCPU() (t CPUTimes, ok bool) {
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
		t.Total += v[i]
	}
	t.Busy = v[0] + v[1] + v[2] + v[5] + v[6]
	t.Steal = v[7]
	return t, true
}

// CPUPercents returns the busy and steal shares of the machine's CPU time
// between a and b, in percent (one decimal); NaN without ticks between.
func CPUPercents(a, b CPUTimes) (busy, steal float64) {
	total := float64(b.Total - a.Total)
	if b.Total <= a.Total {
		return math.NaN(), math.NaN()
	}
	round := func(x float64) float64 { return math.Round(x*1000/total) / 10 }
	return round(float64(b.Busy - a.Busy)), round(float64(b.Steal - a.Steal))
}
