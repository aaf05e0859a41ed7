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
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

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
			if got := l.Breaker(); got != resilient.BreakerClosed {
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
		if got := l.Breaker(); got != resilient.BreakerClosed {
			t.Fatalf("breaker %s, want closed", got)
		}
	})
}

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
				for l.Breaker() == resilient.BreakerClosed && failing < 100 {
					admit(t, l, p, "k", 1, ratelimit.ModeLocal)
					failing++
				}
				if got := l.Breaker(); got != resilient.BreakerOpen {
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
				if got := l.Breaker(); got != resilient.BreakerOpen {
					t.Fatalf("store still out: %s, want open", got)
				}
				f.down.Store(false)
				f.hang.Store(false)
				settle(1500 * time.Millisecond)
				if got := l.Breaker(); got != resilient.BreakerClosed {
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
		if got := l.Breaker(); got != resilient.BreakerOpen {
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
			if got := l.Breaker(); got != resilient.BreakerOpen {
				t.Fatalf("store down: breaker %s, want open", got)
			}
			f.slowPings.Store(slow)
			f.down.Store(false)
			start := time.Now()
			for l.Breaker() == resilient.BreakerOpen {
				time.Sleep(10 * time.Millisecond)
			}
			d := time.Since(start)
			for l.Breaker() != resilient.BreakerClosed {
				time.Sleep(10 * time.Millisecond)
			}
			return d
		}
		// One slow ping: one tick to the slow probe, its deadline
		// (SlowWindow, 250 ms), one tick to the next (ProbeInterval is 1 s).
		if d := back(1); d > 450*time.Millisecond {
			t.Errorf("one slow ping after refused ones: open for %v after the store was back, want at most 450 ms", d)
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
		if s := l.Status(); s.Opens != 0 || l.Breaker() != resilient.BreakerClosed {
			t.Errorf("breaker %s after %d openings, want closed throughout", l.Breaker(), s.Opens)
		}
	})
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
		if l.Breaker() != resilient.BreakerOpen {
			t.Fatalf("%s, want open", l.Breaker())
		}
		f.down.Store(false)
		settle(150 * time.Millisecond)
		if l.Breaker() == resilient.BreakerOpen {
			t.Fatal("still open 150 ms after the store came back: a refusing store was not probed at every tick")
		}

		f.hang.Store(true)
		settle(time.Second)
		if l.Breaker() != resilient.BreakerOpen {
			t.Fatalf("%s, want open", l.Breaker())
		}
		pings := len(f.PingCalls())
		settle(3 * time.Second)
		if n := len(f.PingCalls()) - pings; n > 4 {
			t.Fatalf("%d probes of a hanging store in 3 s, want one a ProbeInterval", n)
		}
	})
}
