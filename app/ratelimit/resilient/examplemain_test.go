package resilient_test

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
)

// The same file is ../redisstore/examplemain_test.go: test files cannot be
// shared between packages (a redistest function that takes no testing.TB
// would hold it once).

// runWithExampleRedis runs the package's tests and examples with a
// redis-server up for the examples (exampleRedis), and returns the exit code.
func runWithExampleRedis(m *testing.M) int {
	flag.Parse()
	stop, err := exampleRedis()
	code := m.Run()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples:", err)
		return 1
	}
	return code
}

// exampleRedis starts the redis-server the examples talk to, with the tests'
// helper (redistest.StartServer), and puts its URL and a fresh journal
// directory in the environment the examples read, under the names the
// service reads them by (RL_REDIS_URL, RL_JOURNAL_DIR). An example takes no
// *testing.T, so the helper gets a mainTB. When redis-server is missing the
// examples are skipped (-test.skip) and, with CI set, the run fails, as
// redistest.Require rules for tests. stop ends the server.
func exampleRedis() (stop func(), err error) {
	tb := &mainTB{}
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		tb.stop()
		stop = func() {}
		ms, ok := r.(mainStop)
		if !ok {
			ms = mainStop{msg: fmt.Sprint("redistest: ", r)}
		}
		skip := flag.Lookup("test.skip").Value.String()
		if skip != "" {
			skip += "|"
		}
		_ = flag.Set("test.skip", skip+"^Example")
		if !ms.skip {
			err = errors.New(ms.msg)
			return
		}
		fmt.Fprintln(os.Stderr, "examples skipped:", ms.msg)
	}()
	srv := redistest.StartServer(tb, redistest.ServerOptions{})
	for k, v := range map[string]string{
		"RL_REDIS_URL":   "redis://" + srv.Addr() + "/0",
		"RL_JOURNAL_DIR": filepath.Join(tb.TempDir(), "journal"),
	} {
		if err := os.Setenv(k, v); err != nil {
			tb.Fatal(err)
		}
	}
	return tb.stop, nil
}

// mainTB is the testing.TB that TestMain lends the test helpers: it keeps
// their cleanups for stop, and turns Fatal and Skip into a mainStop panic
// that exampleRedis recovers. A method it does not define (the embedded nil
// TB's) panics as well.
type mainTB struct {
	testing.TB
	cleanups []func()
}

// mainStop is why a helper stopped: Skip (skip) or Fatal.
type mainStop struct {
	skip bool
	msg  string
}

func (tb *mainTB) Helper()                         {}
func (tb *mainTB) Name() string                    { return "TestMain" }
func (tb *mainTB) Cleanup(f func())                { tb.cleanups = append(tb.cleanups, f) }
func (tb *mainTB) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
func (tb *mainTB) Fatal(args ...any)               { panic(mainStop{msg: fmt.Sprint(args...)}) }
func (tb *mainTB) Fatalf(format string, args ...any) {
	panic(mainStop{msg: fmt.Sprintf(format, args...)})
}
func (tb *mainTB) Skip(args ...any) { panic(mainStop{skip: true, msg: fmt.Sprint(args...)}) }

func (tb *mainTB) TempDir() string {
	dir, err := os.MkdirTemp("", "example-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// stop runs the cleanups, the last registered first.
func (tb *mainTB) stop() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
	tb.cleanups = nil
}
