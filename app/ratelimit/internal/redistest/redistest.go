// Package redistest starts real Redis processes for integration tests: a
// standalone server (StartServer), a three-master Redis Cluster
// (StartCluster), a master and a replica watched by three Sentinels
// (StartSentinel), and a fault-injection TCP proxy to put in front of any of
// them (StartProxy).
//
// Every process runs redis-server from the host (Debian: apt-get install
// redis-server) on a free loopback port, in its own t.TempDir, and is killed
// in t.Cleanup whether the test passes or not; on Linux the kernel also kills
// it if the test binary dies first. Tests skip when redis-server is missing,
// unless the environment variable CI is set, in which case they fail.
//
// The helpers wait by polling with a deadline, never by sleeping for a fixed
// time, and report failures with t.Fatalf, so they must be called from the
// test's goroutine. The package needs a Unix system (signals such as SIGSTOP).
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// installHint is how to get the binaries that Require looks for.
const installHint = "apt-get install redis-server"

const (
	// readyTimeout bounds the wait for a redis-server process to answer PING.
	readyTimeout = 10 * time.Second
	// pollInterval is the pause between two probes while polling.
	pollInterval = 25 * time.Millisecond
	// logTailLines is how much of a server log a failure message shows.
	logTailLines = 40
)

// Require returns the path of the executable bin, looked up in PATH and then
// in /usr/sbin and /usr/bin. When it is missing, Require fails the test if the
// environment variable CI is non-empty and skips it otherwise; either way the
// message carries the install hint "apt-get install redis-server".
func Require(t testing.TB, bin string) string {
	t.Helper()
	p, err := lookBinary(bin)
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal(err)
	}
	t.Skip(err)
	return ""
}

// lookBinary finds bin as Require does.
func lookBinary(bin string) (string, error) {
	if p, err := exec.LookPath(bin); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
		p := filepath.Join(dir, bin)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("redistest: %s not found in PATH, /usr/sbin or /usr/bin; install it with: %s", bin, installHint)
}

// clusterBusOffset is the distance between a cluster node's client port and
// its cluster bus port.
const clusterBusOffset = 10000

// freePort returns a loopback TCP port that was free a moment ago: the kernel
// picks it for a listener on port 0, which is then closed. Another process may
// take it before redis-server binds it; the caller retries in that case. With
// clusterBus, port+10000 must be a valid port and free too.
func freePort(clusterBus bool) (int, error) {
	var lastErr error
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !clusterBus {
			return port, l.Close()
		}
		if port+clusterBusOffset > 65535 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+clusterBusOffset))
		l.Close()
		if err != nil {
			lastErr = err
			continue
		}
		return port, bus.Close()
	}
	return 0, fmt.Errorf("free port: no port p with p and p+%d free (last error: %v)", clusterBusOffset, lastErr)
}

// permanentError stops poll early: the condition can no longer become true.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }

func (e *permanentError) Unwrap() error { return e.err }

// permanent marks err as one that poll must not retry.
func permanent(err error) error { return &permanentError{err: err} }

// poll calls check every pollInterval until it returns nil, returns an error
// made by permanent, or ctx is done. It returns nil on success, the permanent
// error, or ctx's error together with the last error of check.
func poll(ctx context.Context, check func(ctx context.Context) error) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if pe, ok := errors.AsType[*permanentError](err); ok {
			return pe.err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// pollFor is poll with a fresh deadline of d.
func pollFor(d time.Duration, check func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return poll(ctx, check)
}

// tail returns the last n lines of the file at path, or a note saying why it
// could not be read.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	b = bytes.TrimRight(b, "\n")
	for i, cut := len(b)-1, 0; i >= 0; i-- {
		if b[i] == '\n' {
			if cut++; cut == n {
				return string(b[i+1:])
			}
		}
	}
	return string(b)
}

// infoField returns the value of field in the text of an INFO reply.
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":"); ok && k == field {
			return v
		}
	}
	return ""
}

// PairState reads the state redisstore keeps for a token bucket or GCRA
// key (its lua/state.lua): the two integers a and b of its string. No
// state: "", "".
func PairState(ctx context.Context, c redis.Cmdable, key string) (a, b string, err error) {
	v, err := c.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", "", nil
	case err != nil:
		return "", "", err
	}
	parts := strings.SplitN(v, ":", 3)
	if len(parts) < 2 {
		return "", "", fmt.Errorf("state %q: want <a>:<b>[:<admission>]", v)
	}
	return parts[0], parts[1], nil
}
