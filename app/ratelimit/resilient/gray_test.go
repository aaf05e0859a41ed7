package resilient_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// TestGrayFailureKeepsTheShare: a store that answers every other call and
// times out the rest (slow, not dead: the breaker stays closed). Each
// answer brings a newer snapshot, and the next timed-out call starts its
// local share afresh from it; the share must still count the local grants
// the store does not have yet (no heartbeat tick replays them here), or
// every fresh share grants again what the one before it granted. The local
// grants stay within the first share: a quarter of the limit.
func TestGrayFailureKeepsTheShare(t *testing.T) {
	for _, alg := range contract.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				var calls atomic.Int64
				decide := f.DecideFunc
				f.DecideFunc = func(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
					if calls.Add(1)%2 == 0 {
						<-ctx.Done()
						return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ctx.Err())
					}
					return decide(ctx, req)
				}
				// No tick during the test: nothing is replayed.
				l := newLimiter(t, f, resilient.Config{HeartbeatInterval: time.Hour})
				p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: time.Hour}
				local := 0
				for range 200 {
					d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed && d.Mode == ratelimit.ModeLocal {
						local++
					}
				}
				if l.Breaker() != resilient.BreakerClosed {
					t.Fatalf("breaker %s: the store answered every other call, it is not out", l.Breaker())
				}
				if st := l.Status(); st.LocalDecisions < 40 {
					t.Fatalf("%d local decisions: the test did not test", st.LocalDecisions)
				}
				if local > 25 {
					t.Fatalf("%d local grants, want at most the first share (25)", local)
				}
			})
		})
	}
}

// TestFloodDoesNotResetAHotKey: during an outage a flood of distinct
// identities evicts the hot keys from the key table; a hot key that comes
// back gets no more than it had: one that spent its share locally, nor one
// that the store had spent before the outage (refused locally, granted
// nothing).
func TestFloodDoesNotResetAHotKey(t *testing.T) {
	for _, alg := range contract.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				l := newLimiter(t, f, resilient.Config{KeyCapacity: 1000})
				p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: time.Hour}
				admit(t, l, p, "spent", 100, ratelimit.ModeRedis)
				admit(t, l, p, "granted", 60, ratelimit.ModeRedis)
				f.down.Store(true)
				if got := admit(t, l, p, "granted", 20, ratelimit.ModeLocal); got != 10 {
					t.Fatalf("granted: %d local grants, want its share of the 40 left (10)", got)
				}
				if got := admit(t, l, p, "spent", 5, ratelimit.ModeLocal); got != 0 {
					t.Fatalf("spent: %d local grants, want 0", got)
				}
				for i := range 20_000 {
					admit(t, l, p, fmt.Sprint("flood-", i), 1, ratelimit.ModeLocal)
				}
				if st := l.Status(); st.Evictions < 19_000 {
					t.Fatalf("%d evictions: the flood did not evict", st.Evictions)
				}
				for _, k := range []string{"granted", "spent"} {
					if got := admit(t, l, p, k, 20, ratelimit.ModeLocal); got != 0 {
						t.Errorf("%s after the flood: %d more local grants, want 0", k, got)
					}
				}
			})
		})
	}
}

// TestCallerGoneIsStillCounted: a caller whose context ended before or
// during its decision still gets its request decided and counted (in the
// store, or locally), never an error that a middleware could fail open on.
func TestCallerGoneIsStillCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Hour}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for i := range 12 {
			d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"})
			if err != nil || d.Mode != ratelimit.ModeRedis || d.Allowed != (i < 10) {
				t.Fatalf("request %d of a gone caller: %+v %v; want decided in the store", i, d, err)
			}
		}
		f.down.Store(true)
		d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "other"})
		if err != nil || d.Mode != ratelimit.ModeLocal || !d.Allowed {
			t.Fatalf("gone caller, store down: %+v %v; want a local grant", d, err)
		}
		if st := l.Status(); st.Journal.Granted != 1 {
			t.Fatalf("journal %+v: the local grant is not journaled", st.Journal)
		}
	})
}

// TestWallClockStepDoesNotMoveTheFallback: during an outage the wall clock
// jumps forward by a window and later back; the local shares go on at the
// rate time really passes: the jump refills nothing and ages nothing out,
// and the step back locks nothing.
func TestWallClockStepDoesNotMoveTheFallback(t *testing.T) {
	for _, alg := range contract.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var step atomic.Int64
				f := newFakeStore()
				l := newLimiter(t, f, resilient.Config{Now: func() time.Time {
					return time.Now().Round(0).Add(time.Duration(step.Load()))
				}})
				p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
				admit(t, l, p, "k", 100, ratelimit.ModeRedis)
				f.down.Store(true)
				if got := admit(t, l, p, "k", 10, ratelimit.ModeLocal); got != 0 {
					t.Fatalf("spent key at the outage: %d local grants, want 0", got)
				}
				step.Store(int64(10 * time.Second))
				if got := admit(t, l, p, "k", 10, ratelimit.ModeLocal); got != 0 {
					t.Fatalf("after the wall clock jumped a window ahead: %d local grants, want 0", got)
				}
				step.Store(0)
				// A quarter of what a second refills (the token bucket and
				// GCRA refill 10/s) or nothing (the windows: the grants are
				// still in them): never more.
				settle(time.Second)
				if got := admit(t, l, p, "k", 10, ratelimit.ModeLocal); got > 3 {
					t.Fatalf("a second later: %d local grants, want at most 3", got)
				}
			})
		})
	}
}

// TestSlowStoreIsStillAsked: a store that times out some calls but keeps
// answering others is slow, not stalled: every decision still goes to it,
// whatever the run of timeouts, instead of waiting behind a probe while a
// local share with nothing to refill it refuses.
func TestSlowStoreIsStillAsked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		var calls atomic.Int64
		decide := f.DecideFunc
		f.DecideFunc = func(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
			if n := calls.Add(1); n%4 != 0 { // three timeouts, one answer
				<-ctx.Done()
				return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ctx.Err())
			}
			return decide(ctx, req)
		}
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Minute}
		ctx := context.Background()
		var wg sync.WaitGroup
		for g := range 8 { // concurrent callers, so timeouts come in runs
			wg.Go(func() {
				for i := range 20 {
					_, _ = l.Decide(ctx, ratelimit.Request{Policy: p, Key: fmt.Sprint("k", g, "-", i%3)})
					time.Sleep(5 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		if n := calls.Load(); n < 8*20 {
			t.Fatalf("%d store calls for %d decisions: decisions were kept from a store that answers", n, 8*20)
		}
		if l.Breaker() != resilient.BreakerClosed {
			t.Fatalf("breaker %s", l.Breaker())
		}
	})
}

// TestOpenBreakerClosesOverASlowStore: an instance whose breaker opened
// comes back, at its next probes, to a store that answers every call a
// little within the timeout: slow, not dead. Its ping is two round trips
// (PING, then FUNCTION LOAD): under one timeout it never fitted, and the
// instance stayed local while the others held its share back from every
// client, for as long as the store was slow (chaos redis-slow).
func TestOpenBreakerClosesOverASlowStore(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	px := redistest.StartProxy(t, srv.Addr())
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{px.Addr()}, Timeout: fleetTimeout, PoolSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// As the service ships it: the store bounds each call by the timeout.
	cfg := recoveryConfig("app1")
	cfg.ExpectedInstances = 1
	l, err := resilient.New(redisstore.New(c, redisstore.Config{Timeout: fleetTimeout}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	waitFor(t, "a heartbeat", 5*time.Second, func() bool { return l.Status().Live == 1 })

	px.Blackhole()
	waitFor(t, "the breaker to open", 5*time.Second, func() bool { return l.Breaker() == resilient.BreakerOpen })
	px.ClearToxics()
	px.Latency(fleetTimeout * 6 / 10) // one round trip fits in the timeout, two do not
	defer px.ClearToxics()
	// Before, no probe could succeed: it stayed open however long.
	waitFor(t, "the breaker to close over the slow store", 25*cfg.ProbeInterval, func() bool {
		return l.Breaker() == resilient.BreakerClosed
	})
}
