//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil: outside Linux there is no parent-death signal, so
// only t.Cleanup stops the processes.
func sysProcAttr() *syscall.SysProcAttr { return nil }
