package main

// The fallback rows: the decision, its grant journaled in memory or to a
// file, Redis out.

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// fallbackRows measures the local decision of an instance whose Redis is
// out, its grant journaled in memory only and to a file.
func fallbackRows(logger *slog.Logger) []Row {
	var rows []Row
	bench := func(name string, fn func(b *testing.B)) {
		r := testing.Benchmark(fn)
		rows = append(rows, Row{Name: name, Goroutines: 1, NsPerOp: round(float64(r.NsPerOp())), AllocsPerOp: r.AllocsPerOp(),
			DecisionsPerS: round(float64(r.N) / r.T.Seconds())})
		fmt.Fprintf(display, "%-28s %10d ns/op %4d allocs/op\n", name, r.NsPerOp(), r.AllocsPerOp())
	}
	// The decision with its grant journaled in memory, and to a file (the
	// service's RL_JOURNAL_DIR: a write before the answer, fsync apart).
	for _, file := range []bool{false, true} {
		name := "fallback/decision"
		if file {
			name = "fallback/decision-journal-file"
		}
		bench(name, func(b *testing.B) {
			cfg := resilient.Config{Instance: "bench-fallback", Logger: logger, ExpectedInstances: 4}
			if file {
				cfg.JournalDir = b.TempDir()
			}
			lim, err := resilient.New(downStore{}, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer lim.Close(context.Background())
			p := ratelimit.Policy{Name: "fb", Algorithm: ratelimit.GCRA, Limit: ratelimit.MaxLimit, Window: time.Second}
			for lim.Breaker() != resilient.BreakerOpen {
				_, _ = lim.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "warm"})
				time.Sleep(time.Millisecond)
			}
			keys := make([]string, 1000)
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
				// Every key decided once before the clock starts, and the
				// decision checked: an invalid policy measured only its error.
				if d, err := lim.Decide(context.Background(), ratelimit.Request{Policy: p, Key: keys[i]}); err != nil || d.Mode != ratelimit.ModeLocal {
					b.Fatalf("fallback decision: %+v, %v", d, err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				_, _ = lim.Decide(context.Background(), ratelimit.Request{Policy: p, Key: keys[i%len(keys)]})
			}
		})
	}
	// The fallback's memory with 1M distinct keys: bounded by its key
	// capacity (the service's default, 100 000), not by the keys seen.
	{
		lim, err := resilient.New(downStore{}, resilient.Config{Instance: "bench-memory", Logger: logger, ExpectedInstances: 4, JournalMax: 1})
		if err == nil {
			p := ratelimit.Policy{Name: "fb", Algorithm: ratelimit.GCRA, Limit: 100, Window: time.Second}
			for lim.Breaker() != resilient.BreakerOpen {
				_, _ = lim.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "warm"})
				time.Sleep(time.Millisecond)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			const keys = 1_000_000
			start := time.Now()
			for i := range keys {
				_, _ = lim.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "m" + strconv.Itoa(i)})
			}
			elapsed := time.Since(start)
			runtime.GC()
			runtime.ReadMemStats(&after)
			st := lim.Status()
			_ = lim.Close(context.Background())
			heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			rows = append(rows, Row{Name: "fallback/memory-1M-keys", Goroutines: 1, DecisionsPerS: round(keys / elapsed.Seconds()),
				HeapBytes: heap, KeysHeld: int64(st.Keys)})
			fmt.Fprintf(display, "%-28s %10d keys held of 1M, heap +%d MiB\n", "fallback/memory-1M-keys", st.Keys, heap>>20)
		}
	}
	return rows
}

// downStore is a Store whose every call fails at once: the fallback decides.
type downStore struct{}

var errDown = fmt.Errorf("%w: bench: down", ratelimit.ErrUnavailable)

func (downStore) Decide(context.Context, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, errDown
}
func (downStore) Ping(context.Context) error { return errDown }
func (downStore) Heartbeat(context.Context, string, time.Duration, time.Duration) (store.Fleet, error) {
	return store.Fleet{}, errDown
}
func (downStore) Generation(context.Context) (string, error) { return "", errDown }
func (downStore) Leave(context.Context, string, time.Duration, time.Duration) error {
	return errDown
}
func (downStore) Replay(_ context.Context, b []store.ReplayBatch) ([]store.ReplayResult, []error) {
	errs := make([]error, len(b))
	for i := range errs {
		errs[i] = errDown
	}
	return make([]store.ReplayResult, len(b)), errs
}
