package loadtest

import (
	"os"
	"runtime/pprof"
)

// StartCPUProfile writes a CPU profile of the process to path until the
// returned stop is called (the load tools' -cpuprofile flag). An empty path
// profiles nothing.
func StartCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
