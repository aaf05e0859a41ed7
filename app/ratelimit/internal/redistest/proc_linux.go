package redistest

import "syscall"

// sysProcAttr asks the kernel to SIGKILL redis-server when the test binary
// dies, so that a crashed or killed `go test` leaves no process behind.
// Pdeathsig fires when the OS thread that started the child exits, not the
// process; the Go runtime only ends a thread when a goroutine that locked it
// (runtime.LockOSThread) returns without unlocking it, which neither this
// package nor go-redis does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
