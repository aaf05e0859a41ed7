package service

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// jsonLines parses every line of a JSON log, failing on one that is not.
func jsonLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestRedisLoggerHoldsBackRepeats(t *testing.T) {
	var buf syncBuffer
	now := time.Unix(1000, 0)
	l := newRedisLogger(slog.New(slog.NewJSONHandler(&buf, nil)), time.Second, func() time.Time { return now })
	const dial = "redis: connection pool: failed to dial after %d attempts: %v"
	steps := []struct {
		at     time.Duration
		format string
	}{
		{0, dial}, {100 * time.Millisecond, dial}, {200 * time.Millisecond, "sentinel: %s"},
		{900 * time.Millisecond, dial}, {1100 * time.Millisecond, dial},
	}
	for _, s := range steps {
		now = time.Unix(1000, 0).Add(s.at)
		l.Printf(context.Background(), s.format, 1, "refused")
	}
	lines := jsonLines(t, buf.String())
	want := []struct {
		detail     string
		suppressed float64
	}{
		{"connection pool: failed to dial after 1 attempts: refused", 0},
		{"sentinel: %!s(int=1)%!(EXTRA string=refused)", 0},
		{"connection pool: failed to dial after 1 attempts: refused", 2},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		got := lines[i]
		s, _ := got["suppressed"].(float64)
		if got["level"] != "WARN" || got["msg"] != "redis client" || got["component"] != "go-redis" || got["detail"] != w.detail || s != w.suppressed {
			t.Errorf("line %d = %v, want detail %q, suppressed %v", i, got, w.detail, w.suppressed)
		}
	}
}

// TestRedisLogIsJSON: with Redis unreachable, go-redis' own complaints (a
// Sentinel that does not answer) reach the service's JSON log, not stderr
// as plain lines. (A failed dial is no complaint of go-redis': redisstore's
// dialer hands it the failure as a connection that fails, and the breaker's
// transition line says Redis is out.)
func TestRedisLogIsJSON(t *testing.T) {
	s, logs := startServer(t, map[string]string{"RL_REDIS_ADDRS": deadAddr(t), "RL_REDIS_MASTER_NAME": "mymaster"})
	get(t, "http://"+s.PublicAddr()+"/api/gcra")
	eventually(t, func() string {
		for _, l := range jsonLines(t, logs.String()) {
			if l["component"] == "go-redis" && strings.Contains(l["detail"].(string), "GetMasterAddrByName") {
				return ""
			}
		}
		return "no go-redis line in the log:\n" + logs.String()
	})
}

func TestRecoveryDuration(t *testing.T) {
	now := time.Unix(1000, 0)
	r := newRecoveryMetrics(func() time.Time { return now })
	reg := prometheus.NewRegistry()
	reg.MustRegister(r.duration)
	steps := []struct {
		at       time.Duration
		from, to resilient.BreakerState
	}{
		{0, resilient.BreakerClosed, resilient.BreakerOpen},
		{5 * time.Second, resilient.BreakerOpen, resilient.BreakerRecovering},
		{6 * time.Second, resilient.BreakerRecovering, resilient.BreakerOpen}, // the replay failed: not a recovery
		{9 * time.Second, resilient.BreakerOpen, resilient.BreakerRecovering},
		{12 * time.Second, resilient.BreakerRecovering, resilient.BreakerClosed},
	}
	for _, s := range steps {
		now = time.Unix(1000, 0).Add(s.at)
		r.observe(s.from, s.to)
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v %v", mfs, err)
	}
	h := mfs[0].GetMetric()[0].GetHistogram()
	if h.GetSampleCount() != 1 || h.GetSampleSum() != 3 {
		t.Errorf("count %d, sum %v; want one recovery of 3 s", h.GetSampleCount(), h.GetSampleSum())
	}
}
