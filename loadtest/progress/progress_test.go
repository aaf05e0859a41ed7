package progress

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/loadtest"
)

// buffer is a bytes.Buffer safe for the Reporter's redraw goroutine.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func rec(status int, instance, mode string) loadtest.Record {
	return loadtest.Record{Status: status, Instance: instance, Mode: mode}
}

// TestLinePerPhase: off a terminal, one line per phase with the phase's
// own figures, nothing between; other output passes through as it is.
func TestLinePerPhase(t *testing.T) {
	var out buffer
	now := time.Unix(1000, 0)
	r := New(&out, WithTerminal(false), WithClock(func() time.Time { return now }))
	r.Reset("redis-kill")
	r.Phase("healthy")
	for range 30 {
		r.Record(rec(200, "app1", "redis"))
	}
	r.Record(rec(429, "app2", "redis"))
	r.Record(rec(0, "", ""))
	now = now.Add(2 * time.Second)
	fmt.Fprintln(r, "    2.0s  redis_down")
	if got := out.String(); got != "    2.0s  redis_down\n" {
		t.Fatalf("before the phase ended: %q", got)
	}
	r.Phase("fault")
	r.Record(rec(200, "app1", "local"))
	r.Add(Counts{Limited: 3})
	now = now.Add(time.Second)
	r.Stop()
	want := "    2.0s  redis_down\n" +
		"progress: redis-kill: phase healthy, 2s: 32 answers (16/s), 2xx 30, 429 1, errors 1; modes: app1 redis 30 app2 redis 1\n" +
		"progress: redis-kill: phase fault, 1s: 4 answers (4/s), 2xx 1, 429 3, errors 0; modes: app1 local 1\n"
	if got := out.String(); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
}

// ansi removes the redraw sequences.
var ansi = regexp.MustCompile(`\r|\x1b\[[0-9]*[AJ]`)

// TestTerminalRedraws: on a terminal the status block is redrawn at the
// interval with the rate, counts, phase and modes; a log line goes above
// it (the block is erased first and drawn again after); Stop erases it.
func TestTerminalRedraws(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out buffer
		r := New(&out, WithTerminal(true), WithWidth(func() int { return 200 }), WithInterval(time.Second))
		r.Reset("loadtest")
		r.Start()
		r.Phase("load")
		for range 50 {
			r.Record(rec(200, "app2", "local"))
			r.Record(rec(429, "app1", "redis"))
		}
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		got := out.String()
		last := got[strings.LastIndex(got, "loadtest  "):]
		want := "loadtest  1s  phase load (1s)\n100/s  2xx 50  429 50  errors 0\nmodes:  app1 redis  app2 local"
		if last != want {
			t.Fatalf("status block %q, want %q", last, want)
		}
		fmt.Fprintln(r, "a log line")
		got = out.String()
		i := strings.LastIndex(got, "a log line\n")
		if i < 0 || !strings.HasSuffix(got[:i], "\r\x1b[2A\x1b[J") {
			t.Errorf("the log line was not written where the block was: %q", got)
		}
		if !strings.HasSuffix(got, "a log line\n"+want) {
			t.Errorf("the block is not drawn again below the log line: %q", got[i:])
		}
		r.Stop()
		got = out.String()
		if !strings.HasSuffix(got, "\r\x1b[2A\x1b[J") {
			t.Errorf("Stop left the block: %q", got[len(got)-40:])
		}
		// Off the sequences, the text reads in order.
		if plain := ansi.ReplaceAllString(got, ""); !strings.Contains(plain, "a log line\n") {
			t.Errorf("text: %q", plain)
		}
	})
}

func TestNilReporter(t *testing.T) {
	var r *Reporter
	r.Start()
	r.Reset("x")
	r.Phase("y")
	r.Record(rec(200, "a", "b"))
	r.Add(Counts{OK: 1})
	r.Detail("z")
	r.Stop()
	if n, err := r.Write([]byte("abc")); n != 3 || err != nil {
		t.Errorf("Write: %d, %v", n, err)
	}
}

// TestPolledCounts: WithCounter's totals are read at each phase end.
func TestPolledCounts(t *testing.T) {
	var out buffer
	now := time.Unix(0, 0)
	var n int64
	r := New(&out, WithTerminal(false), WithClock(func() time.Time { return now }),
		WithCounter(func() Counts { return Counts{OK: n} }))
	n = 7 // before the run: not counted
	r.Reset("bench")
	r.Phase("round 1/3")
	n += 500
	now = now.Add(500 * time.Millisecond)
	r.Stop()
	if want := "progress: bench: phase round 1/3, 500ms: 500 answers (1000/s), 2xx 500, 429 0, errors 0\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}
