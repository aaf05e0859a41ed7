//go:build unix

package main

import "syscall"

// processCPU returns the CPU time this process has used so far (user plus
// system), in µs; false if it cannot be read.
func processCPU() (float64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3, true
}
