package resilient_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/mocks"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// fakeStore is a mocked Store whose decisions, while up, come from an
// in-memory twin of the Redis scripts on the (synctest) clock; while down,
// every call fails like a refused connection, or hangs until its deadline.
type fakeStore struct {
	*mocks.Store
	twin        atomic.Pointer[memstore.Limiter] // swapped for an empty one: a wipe
	gen         atomic.Pointer[string]
	down, hang  atomic.Bool
	failReplay  atomic.Bool
	failBeats   atomic.Bool  // heartbeats refused, decisions answered (a Cluster master down)
	slowBeats   atomic.Int64 // heartbeats left that outlive their deadline (a store busy with other instances' replays)
	slowPings   atomic.Int64 // pings left that outlive their deadline (a Redis starting: its first connection is slow)
	live, susp  atomic.Int64
	lastRequest atomic.Pointer[ratelimit.Request]
	// skew is the store's clock minus the local one, µs.
	skew atomic.Int64
}

func newFakeStore() *fakeStore {
	f := &fakeStore{}
	f.twin.Store(memstore.New())
	gen := "gen-1"
	f.gen.Store(&gen)
	f.live.Store(4)
	fail := func(ctx context.Context) error {
		if f.hang.Load() {
			<-ctx.Done()
			return fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ctx.Err())
		}
		return fmt.Errorf("%w: connection refused", ratelimit.ErrUnavailable)
	}
	f.Store = &mocks.Store{
		DecideFunc: func(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
			f.lastRequest.Store(&req)
			if f.down.Load() || f.hang.Load() {
				return ratelimit.Decision{}, fail(ctx)
			}
			d, err := f.twin.Load().Decide(ctx, req)
			d.Mode = ratelimit.ModeRedis
			return d, err
		},
		PingFunc: func(ctx context.Context) error {
			if f.down.Load() || f.hang.Load() {
				return fail(ctx)
			}
			if f.slowPings.Add(-1) >= 0 {
				<-ctx.Done()
				return fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ctx.Err())
			}
			return nil
		},
		HeartbeatFunc: func(ctx context.Context, _ string, _, _ time.Duration) (store.Fleet, error) {
			if f.down.Load() || f.hang.Load() {
				return store.Fleet{}, fail(ctx)
			}
			if f.failBeats.Load() {
				return store.Fleet{}, fmt.Errorf("%w: connection refused", ratelimit.ErrUnavailable)
			}
			if f.slowBeats.Add(-1) >= 0 {
				<-ctx.Done()
				return store.Fleet{}, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ctx.Err())
			}
			return store.Fleet{Live: int(f.live.Load()), Suspect: int(f.susp.Load()), Generation: *f.gen.Load(),
				Now: time.Now().UnixMicro() + f.skew.Load()}, nil
		},
		GenerationFunc: func(ctx context.Context) (string, error) {
			if f.down.Load() || f.hang.Load() {
				return "", fail(ctx)
			}
			return *f.gen.Load(), nil
		},
		LeaveFunc: func(context.Context, string, time.Duration, time.Duration) error { return nil },
		ReplayFunc: func(ctx context.Context, batches []store.ReplayBatch) ([]store.ReplayResult, []error) {
			if f.down.Load() || f.hang.Load() || f.failReplay.Load() {
				errs := make([]error, len(batches))
				for i := range errs {
					errs[i] = fail(ctx)
				}
				return make([]store.ReplayResult, len(batches)), errs
			}
			return f.twin.Load().Replay(ctx, batches)
		},
	}
	return f
}

func newLimiter(t *testing.T, s store.Store, cfg resilient.Config) *resilient.Limiter {
	t.Helper()
	if cfg.Instance == "" {
		cfg.Instance = "test"
	}
	l, err := resilient.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	synctest.Wait() // the first heartbeat
	return l
}

// admit sends n requests and returns how many were allowed, checking the mode.
func admit(t *testing.T, l ratelimit.Limiter, p ratelimit.Policy, key string, n int, mode ratelimit.Mode) int {
	t.Helper()
	allowed := 0
	for range n {
		d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: key})
		if err != nil {
			t.Fatal(err)
		}
		if d.Mode != mode {
			t.Fatalf("mode %s, want %s", d.Mode, mode)
		}
		if d.Allowed {
			allowed++
		}
	}
	return allowed
}

// A busy store that answers some calls late is slow, not dead: the late
// calls are decided locally one by one and the breaker stays closed, even
// when one stall times out many concurrent calls at once.
func TestBreakerSlowStoreStaysClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{Timeout: 50 * time.Millisecond})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: 10 * time.Second}
		admit(t, l, p, "k", 1, ratelimit.ModeRedis)
		for stall := range 5 {
			// 20 calls in flight when the store stalls past their timeout.
			f.hang.Store(true)
			var local atomic.Int64
			done := make(chan struct{})
			for i := range 20 {
				go func() {
					d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: fmt.Sprint("c", i)})
					if err == nil && d.Mode == ratelimit.ModeLocal {
						local.Add(1)
					}
					done <- struct{}{}
				}()
			}
			for range 20 {
				<-done
			}
			f.hang.Store(false)
			if local.Load() != 20 {
				t.Fatalf("stall %d: %d of 20 timed-out calls decided locally", stall, local.Load())
			}
			// Between stalls the store answers.
			admit(t, l, p, "k", 5, ratelimit.ModeRedis)
			if got := l.Breaker(); got != resilient.Closed {
				t.Fatalf("stall %d: breaker %s, want closed: the store still answers", stall, got)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if s := l.Status(); s.Opens != 0 || s.FailedDecisions != 100 {
			t.Fatalf("status %+v, want no opening and 100 failed decisions", s)
		}
	})
}

// One refused call makes the store suspect at once: when Redis dies, the
// calls in flight fail with a reset, and the next ones dial an address that
// no longer answers (a dead container's drops packets). Those must not each
// wait out the timeout: one probes, the others are decided locally at once.
func TestRefusedCallProbesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{Timeout: 50 * time.Millisecond})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: 10 * time.Second}
		admit(t, l, p, "k", 1, ratelimit.ModeRedis)
		f.down.Store(true)
		admit(t, l, p, "k", 1, ratelimit.ModeLocal) // the call in flight: reset
		f.down.Store(false)
		f.hang.Store(true) // the next ones: no answer
		calls := len(f.DecideCalls())
		start := time.Now()
		var waited atomic.Int64
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				t0 := time.Now()
				d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: fmt.Sprint("c", i)})
				if err != nil || d.Mode != ratelimit.ModeLocal {
					t.Errorf("call %d: %+v, %v; want a local decision", i, d, err)
				}
				if time.Since(t0) > 0 {
					waited.Add(1)
				}
			})
		}
		wg.Wait()
		if n := len(f.DecideCalls()) - calls; n != 1 || waited.Load() != 1 {
			t.Fatalf("%d store calls, %d callers waited (%v); want 1 probe, the other 19 local at once",
				n, waited.Load(), time.Since(start))
		}
		// A success ends it: the store answers every call again.
		f.hang.Store(false)
		admit(t, l, p, "k", 1, ratelimit.ModeRedis)
		calls = len(f.DecideCalls())
		for i := range 5 {
			wg.Go(func() {
				_, _ = l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: fmt.Sprint("d", i)})
			})
		}
		wg.Wait()
		if n := len(f.DecideCalls()) - calls; n != 5 {
			t.Fatalf("after a success: %d of 5 calls reached the store", n)
		}
		if got := l.Breaker(); got != resilient.Closed {
			t.Fatalf("breaker %s, want closed", got)
		}
	})
}

// shardedFake is the fake store as a Redis Cluster: its masters fail on
// their own.
type shardedFake struct{ *fakeStore }

func (shardedFake) Sharded() bool { return true }

// On a sharded store a refused call says one master is down, not the store:
// the calls after it still go to the store (on a Cluster they reach the
// healthy masters), none is decided locally for it.
func TestRefusedCallOnAShardedStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, shardedFake{f}, resilient.Config{Timeout: 50 * time.Millisecond})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: 10 * time.Second}
		admit(t, l, p, "k", 1, ratelimit.ModeRedis)
		f.down.Store(true)
		admit(t, l, p, "k", 1, ratelimit.ModeLocal) // a call to the dead master
		f.down.Store(false)
		f.hang.Store(true) // calls in flight for a while: the store is asked, each one
		calls := len(f.DecideCalls())
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				_, _ = l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: fmt.Sprint("c", i)})
			})
		}
		wg.Wait()
		if n := len(f.DecideCalls()) - calls; n != 20 {
			t.Fatalf("%d of 20 calls reached the store after one refusal on a sharded store", n)
		}
	})
}

func TestBreakerOpensOnFailuresAndTimeouts(t *testing.T) {
	for _, hang := range []bool{false, true} {
		t.Run(map[bool]string{false: "refused", true: "hung"}[hang], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				l := newLimiter(t, f, resilient.Config{Timeout: 50 * time.Millisecond})
				p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 100, Window: 10 * time.Second}
				admit(t, l, p, "k", 5, ratelimit.ModeRedis)
				if hang {
					f.hang.Store(true)
				} else {
					f.down.Store(true)
				}
				calls := len(f.DecideCalls())
				start := time.Now()
				// Each failing call is decided locally, not failed. Refused
				// calls open the breaker at the third; calls that time out
				// only once nothing has answered for SlowWindow (250 ms).
				failing := 0
				for l.Breaker() == resilient.Closed && failing < 100 {
					admit(t, l, p, "k", 1, ratelimit.ModeLocal)
					failing++
				}
				if got := l.Breaker(); got != resilient.Open {
					t.Fatalf("after %d failures: %s, want open", failing, got)
				}
				if !hang && failing != 3 {
					t.Fatalf("refused: opened after %d failures, want 3", failing)
				}
				if took := time.Since(start); hang && (took < 250*time.Millisecond || took > 300*time.Millisecond) {
					t.Fatalf("hung: opened %v after the store stopped answering, want 250-300ms", took)
				}
				admit(t, l, p, "k", 20, ratelimit.ModeLocal)
				if n := len(f.DecideCalls()) - calls; n != failing {
					t.Fatalf("%d store calls while failing, want %d: an open breaker must not touch the store", n, failing)
				}
				// The prober keeps it open while the store is out, and a
				// slow store never closes it.
				settle(10 * time.Second)
				if got := l.Breaker(); got != resilient.Open {
					t.Fatalf("store still out: %s, want open", got)
				}
				f.down.Store(false)
				f.hang.Store(false)
				settle(1500 * time.Millisecond)
				if got := l.Breaker(); got != resilient.Closed {
					t.Fatalf("store back: %s, want closed", got)
				}
				admit(t, l, p, "k", 1, ratelimit.ModeRedis)
				if s := l.Status(); s.Opens != 1 || s.LastRecovery == nil {
					t.Fatalf("status %+v, want one opening and a recovery", s)
				}
			})
		})
	}
}

// A refused heartbeat opens the breaker at once, even while decisions are
// answered: on a Cluster with one master down, an instance whose requests
// mostly reach the other masters would otherwise stay in Redis while the
// rest of the fleet, its heartbeats refused too, decides locally.
func TestRefusedHeartbeatOpensAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{Timeout: 50 * time.Millisecond})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 100, Window: 10 * time.Second}
		admit(t, l, p, "k", 5, ratelimit.ModeRedis)
		f.failBeats.Store(true)
		time.Sleep(100 * time.Millisecond) // one heartbeat interval
		synctest.Wait()
		if got := l.Breaker(); got != resilient.Open {
			t.Fatalf("one refused heartbeat later: %s, want open", got)
		}
		admit(t, l, p, "k", 1, ratelimit.ModeLocal)
	})
}

// A probe that times out right after refused ones is a Redis starting (its
// first connection outlives the timeout), not a hung one: the next probe
// goes at the next tick, not after ProbeInterval. A second timeout in a row
// is a hung store, and waits the interval.
func TestTimeoutAfterRefusalProbesAgainSoon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{Timeout: 50 * time.Millisecond})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 100, Window: 10 * time.Second}
		admit(t, l, p, "k", 1, ratelimit.ModeRedis)
		back := func(slow int64) time.Duration {
			t.Helper()
			f.down.Store(true)
			time.Sleep(500 * time.Millisecond) // opened, probes refused at every tick
			synctest.Wait()
			if got := l.Breaker(); got != resilient.Open {
				t.Fatalf("store down: breaker %s, want open", got)
			}
			f.slowPings.Store(slow)
			f.down.Store(false)
			start := time.Now()
			for l.Breaker() == resilient.Open {
				time.Sleep(10 * time.Millisecond)
			}
			d := time.Since(start)
			for l.Breaker() != resilient.Closed {
				time.Sleep(10 * time.Millisecond)
			}
			return d
		}
		// One slow ping: one tick to the slow probe, its timeout, one tick
		// to the next (ProbeInterval is 1 s).
		if d := back(1); d > 300*time.Millisecond {
			t.Errorf("one slow ping after refused ones: open for %v after the store was back, want at most 300 ms", d)
		}
		// Two in a row: the second waits the interval.
		if d := back(2); d < 900*time.Millisecond {
			t.Errorf("two slow pings: open for %v, want ProbeInterval (1 s)", d)
		}
	})
}

// Two heartbeats that outlive their deadline are a busy store and leave the
// breaker closed; so do three in a row while the decisions are answered (a
// slow store: every instance that went local over it would make the others
// hold its share back from the polite clients); three in a row with nothing
// else answered open it.
func TestSlowHeartbeatsOpenAfterThree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{Timeout: 50 * time.Millisecond})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: 10 * time.Second}
		busy := func(d time.Duration) { // a decision answered every 20 ms
			for range d / (20 * time.Millisecond) {
				_, _ = l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
				time.Sleep(20 * time.Millisecond)
			}
		}
		f.slowBeats.Store(2)
		busy(400 * time.Millisecond)
		if st := l.Status(); st.Opens != 0 {
			t.Fatalf("after two slow heartbeats: opened %d times, want never", st.Opens)
		}
		f.slowBeats.Store(3)
		busy(400 * time.Millisecond)
		if st := l.Status(); st.Opens != 0 {
			t.Fatalf("after three slow heartbeats in a row, with the decisions answered: opened %d times, want never", st.Opens)
		}
		f.slowBeats.Store(3)
		time.Sleep(400 * time.Millisecond) // nothing else succeeds meanwhile
		if st := l.Status(); st.Opens != 1 {
			t.Fatalf("after three slow heartbeats in a row, nothing answered: opened %d times, want once", st.Opens)
		}
	})
}

func TestReplayRunsBeforeClosing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		f.failReplay.Store(true)
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: time.Minute}
		f.down.Store(true)
		settle(2 * time.Second) // heartbeats fail: the breaker opens without traffic
		if l.Breaker() != resilient.Open {
			t.Fatalf("%s, want open after failed heartbeats", l.Breaker())
		}
		if got := admit(t, l, p, "k", 10, ratelimit.ModeLocal); got != 10 {
			t.Fatalf("local grants: %d of 10", got)
		}
		f.down.Store(false) // pings answer, replays fail
		settle(3 * time.Second)
		if l.Breaker() != resilient.Open || len(f.ReplayCalls()) == 0 {
			t.Fatalf("%s after %d replays, want open while the replay fails", l.Breaker(), len(f.ReplayCalls()))
		}
		f.failReplay.Store(false)
		settle(1500 * time.Millisecond)
		if l.Breaker() != resilient.Closed {
			t.Fatalf("%s, want closed after a successful replay", l.Breaker())
		}
		// The store now holds the 10 local grants: 90 left.
		d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
		if err != nil || d.Mode != ratelimit.ModeRedis || d.Remaining != 89 {
			t.Fatalf("after replay: %+v %v, want 89 left in the store", d, err)
		}
		js := l.Status().Journal
		if js.Granted != 10 || js.Replayed != 10 || js.Pending != 0 {
			t.Fatalf("journal %+v, want 10 granted and replayed", js)
		}
	})
}

// A replay that fails right after the probe's ping was answered (a store
// that just came back, its first new connections slow) is tried again at
// the next tick, not a ProbeInterval later; a store that keeps failing the
// replay is probed at the ProbeInterval, not at every tick.
func TestFailedReplayIsRetriedAtOnceThenAtTheInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{HeartbeatInterval: 100 * time.Millisecond, ProbeInterval: time.Second})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 100, Window: time.Minute}
		f.down.Store(true)
		settle(2 * time.Second)
		if got := admit(t, l, p, "k", 5, ratelimit.ModeLocal); got != 5 {
			t.Fatalf("local grants: %d of 5", got)
		}
		// The next probe's ping is answered and its replay fails, once.
		f.failReplay.Store(true)
		f.down.Store(false)
		for len(f.ReplayCalls()) == 0 {
			settle(10 * time.Millisecond)
		}
		failedAt := time.Now()
		f.failReplay.Store(false)
		for l.Breaker() != resilient.Closed && time.Since(failedAt) < 3*time.Second {
			settle(10 * time.Millisecond)
		}
		if took := time.Since(failedAt); l.Breaker() != resilient.Closed || took > 250*time.Millisecond {
			t.Fatalf("%s %v after the failed replay, want closed within a tick or two (not a probe interval)", l.Breaker(), took)
		}
		// A store that keeps failing the replay: one quick retry, then
		// one probe per ProbeInterval.
		f.down.Store(true)
		settle(2 * time.Second)
		admit(t, l, p, "k", 1, ratelimit.ModeLocal)
		f.failReplay.Store(true)
		f.down.Store(false)
		before := len(f.PingCalls())
		settle(5 * time.Second)
		if n := len(f.PingCalls()) - before; n < 5 || n > 7 {
			t.Fatalf("%d probes in 5 s of failing replays, want 5-7 (one per interval, and one quick retry)", n)
		}
	})
}

// TestFallbackShare checks the local budget per algorithm: this instance's
// quarter of what the store last said was left, then refill or ageing.
func TestFallbackShare(t *testing.T) {
	cases := []struct {
		alg ratelimit.Algorithm
		// grants at once after 60 of 100 were used, and after waiting.
		first int
		wait  time.Duration
		later int
	}{
		// 40 tokens left: 10 each. The refill counts only from when the
		// others hold this instance's share back (last heartbeat + 300 ms
		// TTL + two 100 ms intervals): 3.5 s of 4 s at 2.5 tokens/s.
		{ratelimit.TokenBucket, 10, 4 * time.Second, 8},
		{ratelimit.GCRA, 10, 4 * time.Second, 8},
		// 40 left in the window: 10 each; once the 60 age out (10 s) and the
		// local 10 too, a quarter of 100.
		{ratelimit.SlidingWindowLog, 10, 10 * time.Second, 25},
		// Next window, 5 s in: known 60 × 1/2 = 30, room (100-30)/4 = 17.5,
		// local previous 10 × 1/2 = 5: 12 more.
		{ratelimit.SlidingWindowCounter, 10, 15 * time.Second, 12},
	}
	for _, c := range cases {
		t.Run(string(c.alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				l := newLimiter(t, f, resilient.Config{})
				p := ratelimit.Policy{Name: "p", Algorithm: c.alg, Limit: 100, Window: 10 * time.Second}
				if got := admit(t, l, p, "k", 60, ratelimit.ModeRedis); got != 60 {
					t.Fatalf("healthy: %d of 60", got)
				}
				f.down.Store(true)
				if got := admit(t, l, p, "k", 30, ratelimit.ModeLocal); got != c.first {
					t.Fatalf("at the outage: %d local grants, want %d", got, c.first)
				}
				settle(c.wait)
				if got := admit(t, l, p, "k", 40, ratelimit.ModeLocal); got != c.later {
					t.Fatalf("after %v: %d local grants, want %d", c.wait, got, c.later)
				}
				// A key never seen gets a quarter of the quota.
				if got := admit(t, l, p, "new", 40, ratelimit.ModeLocal); got != 25 {
					t.Fatalf("new key: %d local grants, want 25", got)
				}
			})
		})
	}
}

// TestFallbackShareIgnoresCapacityFreedBeforeConfirmation: grants that
// leave the window before the other instances can know this one is missing
// may have been replaced by theirs, so they still count for a window.
func TestFallbackShareIgnoresCapacityFreedBeforeConfirmation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: 10 * time.Second}
		admit(t, l, p, "k", 60, ratelimit.ModeRedis)
		settle(9800 * time.Millisecond) // heartbeats go on: the last one at 9.8 s
		f.down.Store(true)
		// The 60 leave the window at 10 s, before the others can know
		// (9.8 s + 0.5 s): their places count as taken until 20 s.
		settle(2500 * time.Millisecond)
		if got := admit(t, l, p, "k", 40, ratelimit.ModeLocal); got != 10 {
			t.Fatalf("at 12.3 s: %d local grants, want 10 (a quarter of the 40 left)", got)
		}
		settle(8500 * time.Millisecond)
		if got := admit(t, l, p, "k", 40, ratelimit.ModeLocal); got != 15 {
			t.Fatalf("at 20.8 s: %d more local grants, want 15 (a quarter of 100, less the 10)", got)
		}
	})
}

func TestFallbackFactorAndFailureModes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{})
		f.down.Store(true)
		base := ratelimit.Policy{Name: "p", Algorithm: ratelimit.TokenBucket, Limit: 100, Window: 10 * time.Second}
		strict := base
		strict.Name, strict.FallbackFactor = "strict", 0.5
		if got := admit(t, l, strict, "k", 40, ratelimit.ModeLocal); got != 12 {
			t.Fatalf("factor 0.5: %d, want 12 (half of a quarter of 100)", got)
		}
		open := base
		open.Name, open.FailureMode = "open", ratelimit.FailOpen
		if got := admit(t, l, open, "k", 200, ratelimit.ModeOpen); got != 200 {
			t.Fatalf("fail open: %d of 200", got)
		}
		closed := base
		closed.Name, closed.FailureMode = "closed", ratelimit.FailClosed
		if got := admit(t, l, closed, "k", 5, ratelimit.ModeClosed); got != 0 {
			t.Fatalf("fail closed: %d of 5", got)
		}
	})
}

func TestSuspectInstancesAreHeldBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		f.live.Store(3)
		f.susp.Store(1)
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: 10 * time.Second}
		// A quarter is held for the suspect: 75 admitted.
		if got := admit(t, l, p, "k", 100, ratelimit.ModeRedis); got != 75 {
			t.Fatalf("with one suspect of four: %d admitted, want 75", got)
		}
		if w := f.lastRequest.Load().Weight; w != (ratelimit.Weight{Num: 4, Den: 3}) {
			t.Fatalf("weight %+v, want 4/3", w)
		}
		f.susp.Store(0)
		settle(time.Second) // next heartbeat
		if got := admit(t, l, p, "k", 100, ratelimit.ModeRedis); got != 25 {
			t.Fatalf("suspect gone: %d more admitted, want 25", got)
		}
	})
}

// stagedFake is a fakeStore that keeps recovery stages: its heartbeats
// return the others' (set by the test) and the caller's own.
type stagedFake struct {
	*fakeStore
	others atomic.Pointer[[]string]
}

func (f *stagedFake) HeartbeatStage(ctx context.Context, instance string, ttl, grace time.Duration, stage string) (store.Fleet, error) {
	fleet, err := f.Heartbeat(ctx, instance, ttl, grace)
	if err == nil {
		fleet.Stages = append(slices.Clone(*f.others.Load()), stage)
	}
	return fleet, err
}

// TestRecoveringInstancesAreHeldBack: a closed instance holds back the token
// bucket and GCRA shares of the live instances still recovering (they grant
// from what is left of their shares, which their replays left in the
// store), as it does a suspect's, until a heartbeat says they closed; not
// the window algorithms'. Before, the first instance to close after an
// outage spent in Redis what the others still granted locally (redis-kill
// natively, without the fault proxy: one over the limit).
func TestRecoveringInstancesAreHeldBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &stagedFake{fakeStore: newFakeStore()}
		recovering := []string{"g:3", "g:2", "g:3"} // one of the three others has replayed, not closed
		f.others.Store(&recovering)
		l := newLimiter(t, f, resilient.Config{})
		settle(time.Second) // a heartbeat with the stages
		if st := l.Status(); st.Recovering != 1 {
			t.Fatalf("recovering %d, want 1", st.Recovering)
		}
		for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
			p := ratelimit.Policy{Name: "p-" + string(alg), Algorithm: alg, Limit: 100, Window: time.Hour}
			if got := admit(t, l, p, "k", 100, ratelimit.ModeRedis); got != 75 {
				t.Errorf("%s, one of four recovering: %d admitted, want 75", alg, got)
			}
			if w := f.lastRequest.Load().Weight; w != (ratelimit.Weight{Num: 4, Den: 3}) {
				t.Errorf("%s: weight %+v, want 4/3", alg, w)
			}
		}
		p := ratelimit.Policy{Name: "log", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: time.Hour}
		if got := admit(t, l, p, "k", 100, ratelimit.ModeRedis); got != 100 {
			t.Errorf("sliding window log: %d admitted, want 100 (its replays leave no stock)", got)
		}
		closed := []string{"g:3", "g:3", "g:3"}
		f.others.Store(&closed)
		settle(time.Second) // the next heartbeat
		// (The held-back charges scaled: "k" has nothing left. A new key
		// has its whole policy.)
		for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
			p := ratelimit.Policy{Name: "p-" + string(alg), Algorithm: alg, Limit: 100, Window: time.Hour}
			if got := admit(t, l, p, "k2", 100, ratelimit.ModeRedis); got != 100 {
				t.Errorf("%s, every instance closed: %d admitted, want 100", alg, got)
			}
			if w := f.lastRequest.Load().Weight; w != (ratelimit.Weight{}) {
				t.Errorf("%s, every instance closed: weight %+v, want the whole policy", alg, w)
			}
		}
	})
}

// TestOneMissedHeartbeatHoldsNothingBack: a heartbeat that finds three of
// the four instances missing once (their process stalled; the next one finds
// them back) holds nothing back, so a key keeps its whole quota; the second
// such heartbeat in a row does.
func TestOneMissedHeartbeatHoldsNothingBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: 10 * time.Second}
		f.live.Store(1)
		f.susp.Store(3)
		settle(100 * time.Millisecond) // one heartbeat finds them missing
		if got := admit(t, l, p, "k", 60, ratelimit.ModeRedis); got != 60 {
			t.Fatalf("after one heartbeat with three missing: %d of 60 admitted, want all", got)
		}
		if w := f.lastRequest.Load().Weight; w != (ratelimit.Weight{}) {
			t.Fatalf("weight %+v, want none", w)
		}
		settle(100 * time.Millisecond) // the second in a row
		if got := admit(t, l, p, "k2", 60, ratelimit.ModeRedis); got != 25 {
			t.Fatalf("after two heartbeats with three missing: %d of 60 admitted, want 25 (a quarter)", got)
		}
		f.susp.Store(0)
		f.live.Store(4)
		settle(100 * time.Millisecond) // they are back
		if got := admit(t, l, p, "k2", 100, ratelimit.ModeRedis); got != 75 {
			t.Fatalf("all back: %d more admitted, want 75", got)
		}
	})
}

func TestInvalidRequestsAndOddReplies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.TokenBucket, Limit: 10, Window: time.Second}
		if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "a\x00"}); !errors.Is(err, ratelimit.ErrInvalidRequest) {
			t.Fatalf("bad key: %v", err)
		}
		f.DecideFunc = func(context.Context, ratelimit.Request) (ratelimit.Decision, error) {
			return ratelimit.Decision{}, fmt.Errorf("%w: WRONGTYPE", ratelimit.ErrBadReply)
		}
		admit(t, l, p, "k", 10, ratelimit.ModeLocal)
		if l.Breaker() != resilient.Closed {
			t.Fatal("odd replies for one key opened the breaker")
		}
	})
}

// TestKeyCapacityBoundsMemory: the keys remembered never exceed
// KeyCapacity, however many distinct clients come, and every key beyond it
// is an eviction. The capacity is split among the shards exactly (1000 over
// 64 shards: 15 or 16 each), and 5000 keys fill every shard.
func TestKeyCapacityBoundsMemory(t *testing.T) {
	for _, c := range []struct{ capacity, keys int }{{1, 20}, {10, 2000}, {1000, 5000}} {
		t.Run(fmt.Sprint(c.capacity), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				l := newLimiter(t, f, resilient.Config{KeyCapacity: c.capacity})
				p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.SlidingWindowLog, Limit: 10, Window: time.Second}
				for i := range c.keys {
					admit(t, l, p, fmt.Sprint("k", i), 1, ratelimit.ModeRedis)
				}
				if s := l.Status(); s.Keys != c.capacity || int(s.Evictions) != c.keys-c.capacity {
					t.Fatalf("keys %d evictions %d, want %d and %d", s.Keys, s.Evictions, c.capacity, c.keys-c.capacity)
				}
			})
		})
	}
}

// BenchmarkStoreDecisionParallel is the bookkeeping around a store decision
// (the cached-refusal check and the snapshot kept), the store being an
// in-memory twin: with one lock for every key, parallel callers queue on it.
func BenchmarkStoreDecisionParallel(b *testing.B) {
	f := newFakeStore()
	l, err := resilient.New(f, resilient.Config{Instance: "bench", ExpectedInstances: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	p := ratelimit.Policy{Name: "bench", Algorithm: ratelimit.GCRA, Limit: 1_000_000_000, Window: time.Second}
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := ratelimit.Request{Policy: p, Key: fmt.Sprint("client-", next.Add(1))}
		ctx := context.Background()
		for pb.Next() {
			if _, err := l.Decide(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkLocalDecision(b *testing.B) {
	f := newFakeStore()
	f.down.Store(true)
	l, err := resilient.New(f, resilient.Config{Instance: "bench", FailureThreshold: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	for _, alg := range ratelimit.Algorithms {
		b.Run(string(alg), func(b *testing.B) {
			req := ratelimit.Request{Policy: ratelimit.Policy{Name: "bench", Algorithm: alg, Limit: 1000, Window: time.Second}, Key: "client-1"}
			ctx := context.Background()
			_, _ = l.Decide(ctx, req)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Decide(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// settle lets fake time pass (inside a synctest bubble) and waits until the
// limiter's loop is idle again, off the ticker's instants.
func settle(d time.Duration) {
	time.Sleep(d + 7*time.Millisecond)
	synctest.Wait()
}

// TestFailedRestoreIsRetried: Redis comes back without its data while the
// breaker is closed, and the first restores fail. The new generation is not
// taken as known until a restore went through, so it is tried again until
// it does, and the usage before the wipe is back in the store.
func TestFailedRestoreIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		f.live.Store(1)
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "r", Algorithm: ratelimit.GCRA, Limit: 100, Window: time.Hour}
		if n := admit(t, l, p, "k", 30, ratelimit.ModeRedis); n != 30 {
			t.Fatalf("%d of 30 admitted", n)
		}
		f.twin.Store(memstore.New())
		gen := "gen-2"
		f.gen.Store(&gen)
		f.failReplay.Store(true)
		time.Sleep(time.Second) // heartbeats see the new generation; every restore fails
		synctest.Wait()
		if n := l.Status().Restores; n != 0 {
			t.Fatalf("%d restores while the store refused them", n)
		}
		f.failReplay.Store(false)
		time.Sleep(3 * time.Second) // probes or heartbeats try again
		synctest.Wait()
		if n := l.Status().Restores; n != 1 {
			t.Fatalf("%d restores once the store took them, want 1", n)
		}
		d, err := f.twin.Load().Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Remaining != 100-31 {
			t.Errorf("%d remaining after the restore, want %d: the 30 granted before the wipe are back", d.Remaining, 100-31)
		}
	})
}

// TestHeartbeatTeachesTheStoreClock: the store's clock is learned from the
// first heartbeat, before any decision, so grants made locally right after
// a restart are stamped in the store's time.
func TestHeartbeatTeachesTheStoreClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		ahead := 10 * time.Minute
		f.skew.Store(ahead.Microseconds())
		l := newLimiter(t, f, resilient.Config{})
		if got := time.Duration(l.Status().ClockOffsetUS) * time.Microsecond; got != ahead {
			t.Fatalf("clock offset %v after the first heartbeat, want %v", got, ahead)
		}
	})
}

// BenchmarkFootprint reports the heap a remembered key costs (a store
// decision per distinct key: the LRU entry), and what a local grant of a
// distinct key adds (the journaled grant and the key's snapshot), per
// algorithm: go test -run ^$ -bench Footprint ./app/ratelimit/resilient.
func BenchmarkFootprint(b *testing.B) {
	const keys = 50_000
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for _, alg := range ratelimit.Algorithms {
		b.Run(string(alg), func(b *testing.B) {
			p := ratelimit.Policy{Name: "bench", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
			ctx := context.Background()
			var perKey, perGrant float64
			for b.Loop() {
				// A store that keeps nothing (the fake's twin and its
				// mock's call log would be counted with the limiter).
				f := &nullStore{}
				l, err := resilient.New(f, resilient.Config{Instance: "bench", FailureThreshold: 1, KeyCapacity: 2 * keys})
				if err != nil {
					b.Fatal(err)
				}
				before := heap()
				for i := range keys {
					if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k:client-" + strconv.Itoa(i)}); err != nil {
						b.Fatal(err)
					}
				}
				remembered := heap()
				f.down.Store(true)
				for i := range keys {
					// Fresh request ids, as nginx sends: 32 hex digits.
					id := fmt.Sprintf("%032x", i)
					if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k:client-" + strconv.Itoa(i), ID: id}); err != nil {
						b.Fatal(err)
					}
				}
				journaled := heap()
				if s := l.Status(); s.Journal.Pending != keys {
					b.Fatalf("journal holds %d grants, want %d (the breaker did not open?)", s.Journal.Pending, keys)
				}
				perKey = float64(int64(remembered)-int64(before)) / keys
				perGrant = float64(int64(journaled)-int64(remembered)) / keys
				_ = l.Close(ctx)
			}
			b.ReportMetric(perKey, "B/key")
			b.ReportMetric(perGrant, "B/grant")
		})
	}
}

// TestSuspectStoreIsNotWaitedFor: once the last calls all timed out, the
// next decisions do not each wait out the timeout (a paused Redis held every
// request for it until the breaker opened): one call at a time probes the
// store, the others are decided locally at once, and the first success
// ends it.
func TestSuspectStoreIsNotWaitedFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		l := newLimiter(t, f, resilient.Config{Timeout: 50 * time.Millisecond, SlowWindow: time.Second})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: 10 * time.Second}
		admit(t, l, p, "k", 1, ratelimit.ModeRedis)
		f.hang.Store(true)
		start := time.Now()
		admit(t, l, p, "k", 3, ratelimit.ModeLocal) // three calls time out, one after the other
		if waited := time.Since(start); waited != 150*time.Millisecond {
			t.Fatalf("three timed-out calls took %v, want 3 × 50 ms", waited)
		}
		calls := len(f.DecideCalls())
		probed := make(chan struct{})
		go func() {
			defer close(probed)
			admit(t, l, p, "k", 1, ratelimit.ModeLocal) // the probe: it waits for the store
		}()
		synctest.Wait()
		start = time.Now()
		admit(t, l, p, "k", 10, ratelimit.ModeLocal)
		if waited := time.Since(start); waited != 0 {
			t.Errorf("decisions beside the probe waited %v, want none", waited)
		}
		<-probed
		if n := len(f.DecideCalls()) - calls; n != 1 {
			t.Errorf("%d store calls while the store was suspect, want 1 (the probe)", n)
		}
		f.hang.Store(false)
		admit(t, l, p, "k", 1, ratelimit.ModeRedis) // a probe that succeeds
		admit(t, l, p, "k", 5, ratelimit.ModeRedis) // and every call goes to the store again
		if s := l.Status(); s.Opens != 0 || l.Breaker() != resilient.Closed {
			t.Errorf("breaker %s after %d openings, want closed throughout", l.Breaker(), s.Opens)
		}
	})
}

// nullStore answers every decision with the same reply and keeps nothing;
// down fails every call like a refused connection.
type nullStore struct{ down atomic.Bool }

func (s *nullStore) err() error {
	if s.down.Load() {
		return fmt.Errorf("%w: connection refused", ratelimit.ErrUnavailable)
	}
	return nil
}

func (s *nullStore) Decide(_ context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := s.err(); err != nil {
		return ratelimit.Decision{}, err
	}
	return ratelimit.Decision{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: time.Second, Mode: ratelimit.ModeRedis,
		State: ratelimit.State{Now: time.Now().UnixMicro(), Tokens: 99 * req.Policy.WindowMicros(), Current: 1}}, nil
}

func (s *nullStore) Ping(context.Context) error { return s.err() }

func (s *nullStore) Heartbeat(context.Context, string, time.Duration, time.Duration) (store.Fleet, error) {
	return store.Fleet{Live: 1, Generation: "g", Now: time.Now().UnixMicro()}, s.err()
}

func (s *nullStore) Generation(context.Context) (string, error) { return "g", s.err() }

func (s *nullStore) Leave(context.Context, string, time.Duration, time.Duration) error { return nil }

func (s *nullStore) Replay(_ context.Context, b []store.ReplayBatch) ([]store.ReplayResult, []error) {
	errs := make([]error, len(b))
	for i := range errs {
		errs[i] = s.err()
	}
	return make([]store.ReplayResult, len(b)), errs
}

// TestStatusIsOneInstant: local_grants and the journal's counters are read
// at one instant, so every grant is in both or in neither and the books
// balance, however busy the instance (a killed instance's last status is
// compared with what its successor finds in the journal file).
func TestStatusIsOneInstant(t *testing.T) {
	f := &nullStore{}
	f.down.Store(true)
	l, err := resilient.New(f, resilient.Config{Instance: "instant", FailureThreshold: 1, JournalMax: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1_000_000, Window: time.Second}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: fmt.Sprintf("k%d-%d", g, i%50)})
			}
		})
	}
	for range 2000 {
		s := l.Status()
		if s.LocalGrants != s.Journal.Granted || s.Journal.Reconcile() != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("local_grants %d, journal %+v at the same instant: %v", s.LocalGrants, s.Journal, s.Journal.Reconcile())
		}
	}
	close(stop)
	wg.Wait()
}

// TestRefusedStoreIsProbedOften: a store that refuses at once (Redis'
// process down) is probed at every heartbeat tick, so its return is seen
// within about a HeartbeatInterval, not a ProbeInterval; a store that hangs
// is still probed only once a ProbeInterval.
func TestRefusedStoreIsProbedOften(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		f.live.Store(1)
		l := newLimiter(t, f, resilient.Config{})
		f.down.Store(true)
		settle(1200 * time.Millisecond)
		if l.Breaker() != resilient.Open {
			t.Fatalf("%s, want open", l.Breaker())
		}
		f.down.Store(false)
		settle(150 * time.Millisecond)
		if l.Breaker() == resilient.Open {
			t.Fatal("still open 150 ms after the store came back: a refusing store was not probed at every tick")
		}

		f.hang.Store(true)
		settle(time.Second)
		if l.Breaker() != resilient.Open {
			t.Fatalf("%s, want open", l.Breaker())
		}
		pings := len(f.PingCalls())
		settle(3 * time.Second)
		if n := len(f.PingCalls()) - pings; n > 4 {
			t.Fatalf("%d probes of a hanging store in 3 s, want one a ProbeInterval", n)
		}
	})
}

// TestRefusalAnsweredLocally: a key the store refused until T is refused
// without a round trip until T, for requests at least as costly; a cheaper
// request still asks the store (it might fit), and after T the store is
// asked again and admits. No admission changes: only refusals are cached.
func TestRefusalAnsweredLocally(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		f.live.Store(1)
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.TokenBucket, Limit: 6, Window: time.Minute} // a token every 10 s
		ctx := context.Background()
		decide := func(cost int64) ratelimit.Decision {
			t.Helper()
			d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", Cost: cost})
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		for range 5 {
			if !decide(1).Allowed {
				t.Fatal("refused within the burst")
			}
		}
		// One token left: a cost of 3 is refused by the store (20 s to wait).
		calls := len(f.DecideCalls())
		if d := decide(3); d.Allowed || d.Mode != ratelimit.ModeRedis {
			t.Fatalf("cost 3: %+v, want the store's refusal", d)
		}
		if got := len(f.DecideCalls()) - calls; got != 1 {
			t.Fatalf("%d store calls, want 1", got)
		}
		// The same cost again, and a larger one: no round trip.
		for _, cost := range []int64{3, 4} {
			if d := decide(cost); d.Allowed || d.RetryAfter <= 0 {
				t.Fatalf("cost %d: %+v, want a refusal with a retry time", cost, d)
			}
		}
		if got := len(f.DecideCalls()) - calls; got != 1 {
			t.Fatalf("%d store calls for three refusals of the same key, want 1", got)
		}
		// A cheaper request may fit: the store is asked, and admits it.
		if d := decide(1); !d.Allowed {
			t.Fatalf("cost 1 with a token left: %+v, want admitted", d)
		}
		if got := len(f.DecideCalls()) - calls; got != 2 {
			t.Fatalf("%d store calls, want the cheaper request asked", got)
		}
		if s := l.Status(); s.CachedRefusals != 2 {
			t.Fatalf("cached_refusals %d, want 2", s.CachedRefusals)
		}
		// Past the retry time the store is asked again.
		decide(1) // refused by the store: empty
		time.Sleep(31 * time.Second)
		if d := decide(3); !d.Allowed {
			t.Fatalf("after 31 s (3 tokens back): %+v, want admitted", d)
		}
	})
}

// TestGrantsAfterTheChargeAreChargedInFull: once a replay pass has charged
// a token bucket or GCRA key's share through its time, the store refills the
// key at the whole rate: the grants the instance still makes locally while
// it waits for a missing instance owe every unit, and the next pass charges
// all of them. Netted against the outage's share, which by then looked full
// again, they were charged a fraction (1 unit for 10 grants here).
func TestGrantsAfterTheChargeAreChargedInFull(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				f.live.Store(2)
				p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
				var (
					l              *resilient.Limiter
					local, atFirst atomic.Int64
					passes         [][]store.ReplayBatch
				)
				decide := func() {
					d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed && d.Mode == ratelimit.ModeLocal {
						local.Add(1)
					}
				}
				inner := f.ReplayFunc
				f.ReplayFunc = func(ctx context.Context, batches []store.ReplayBatch) ([]store.ReplayResult, []error) {
					if !f.down.Load() { // the passes that reach the store
						if len(passes) == 0 {
							atFirst.Store(local.Load())
							// A request during the pass: the journal keeps the
							// outage's snapshots for the grants after it.
							time.Sleep(200 * time.Millisecond)
							decide()
						}
						passes = append(passes, slices.Clone(batches))
					}
					return inner(ctx, batches)
				}
				l = newLimiter(t, f, resilient.Config{ExpectedInstances: 2})
				send := func(n int, every time.Duration) {
					for range n {
						decide()
						time.Sleep(every)
					}
				}
				send(10, 50*time.Millisecond)
				f.down.Store(true)
				send(400, 50*time.Millisecond) // 20 s at 20/s against a share of 5/s
				// The other instance stays away: this one replays, then waits
				// for it (RecoveryWait), granting locally meanwhile at the
				// share's own rate.
				f.live.Store(1)
				f.down.Store(false)
				send(15, 200*time.Millisecond)
				settle(time.Second)
				if l.Breaker() != resilient.Closed || len(passes) < 2 {
					t.Fatalf("breaker %s after %d replay passes, want closed after two or more", l.Breaker(), len(passes))
				}
				after := local.Load() - atFirst.Load()
				var charged int64
				for _, pass := range passes[1:] {
					for _, b := range pass {
						for _, g := range b.Grants {
							charged += g.Cost
						}
					}
				}
				t.Logf("%d local grants after the first pass, %d units charged by the later passes", after, charged)
				if after == 0 || charged != after {
					t.Errorf("the passes after the first charged %d units for the %d grants made after it, want all of them", charged, after)
				}
			})
		})
	}
}

// TestFullJournalRefuses: once the journal holds its maximum, local grants
// are refused (and counted as overflow) instead of made without a record
// that would bring them to the store.
func TestFullJournalRefuses(t *testing.T) {
	f := &nullStore{}
	f.down.Store(true)
	l, err := resilient.New(f, resilient.Config{Instance: "full", FailureThreshold: 1, JournalMax: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Minute}
	allowed := 0
	for i := range 300 {
		d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: fmt.Sprint("k", i%10)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	s := l.Status()
	if allowed != int(s.Journal.Granted) || s.Journal.Held > 100 || s.Journal.Overflow == 0 || int(s.Journal.Granted)+int(s.Journal.Overflow) != 300 {
		t.Fatalf("%d allowed; journal %+v: want every grant journaled, at most 100 held, the rest refused as overflow", allowed, s.Journal)
	}
}
