package redistest

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Main runs a test binary's tests and examples (m.Run) with one
// redis-server up for the examples, which take no *testing.T: its URL is in
// RL_REDIS_URL, and RL_JOURNAL_DIR names a fresh directory (the names the
// service reads them by). Without redis-server the examples are skipped,
// and with CI set the run fails, as Require rules for tests. Call it from
// TestMain: os.Exit(redistest.Main(m)).
func Main(m *testing.M) int {
	flag.Parse()
	s, err := startDetached()
	if err != nil {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "examples:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "examples skipped:", err)
		skip := flag.Lookup("test.skip").Value.String()
		if skip != "" {
			skip += "|"
		}
		_ = flag.Set("test.skip", skip+"^Example")
		return m.Run()
	}
	defer s.stopDetached()
	for k, v := range map[string]string{
		"RL_REDIS_URL":   "redis://" + s.Addr() + "/0",
		"RL_JOURNAL_DIR": filepath.Join(s.dir, "journal"),
	} {
		if err := os.Setenv(k, v); err != nil {
			fmt.Fprintln(os.Stderr, "examples:", err)
			return 1
		}
	}
	return m.Run()
}

// startDetached starts a standalone redis-server as StartServer does, owned
// by no test: stopDetached kills it and removes its directory.
func startDetached() (*Server, error) {
	bin, err := lookBinary("redis-server")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, keep: map[string]bool{logName: true}}
	const attempts = 5
	for attempt := 1; ; attempt++ {
		if s.port, err = freePort(false); err != nil {
			break
		}
		if err = s.launch(); err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortInUse) || attempt == attempts {
			err = fmt.Errorf("redistest: start %s: %w\n--- last lines of %s ---\n%s", s.Addr(), err, s.LogPath(), tail(s.LogPath(), logTailLines))
			break
		}
	}
	_ = os.RemoveAll(dir)
	return nil, err
}

// stopDetached kills a server of startDetached and removes its directory.
func (s *Server) stopDetached() {
	s.Kill()
	_ = os.RemoveAll(s.dir)
}
