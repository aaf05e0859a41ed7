package resilient_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

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

// TestCounterShareAgesOnlyFromConfirmation: a sliding window counter's
// previous count weighs less as its window passes, and the store gives
// what that frees to the instances deciding in it. A local share counts
// that ageing only from when the others hold its part back: with the
// breaker closed (calls timing out, heartbeats answered) not at all, with
// the store out from the confirmation on. Counted from the reply, a key
// behind a slow Redis was granted its ageing twice, by the shares and by
// the store (chaos redis-slow).
func TestCounterShareAgesOnlyFromConfirmation(t *testing.T) {
	cases := []struct {
		name string
		open bool
		want int
	}{
		// The reply at 15 s: 100 × 0.5 + 1 = 51 used; a quarter of the 49
		// left, however long the store goes on deciding.
		{"breaker closed", false, 12},
		// Out from 15 s; confirmed at 15.5 s (the last heartbeat, at 15 s,
		// plus 0.5 s): at 17.5 s 100 × 0.25 + 1 = 26 used, and the 5 that
		// aged out before the confirmation taken: a quarter of 69.
		{"store out", true, 17},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				hang := f.hangDecisions()
				l := newLimiter(t, f, resilient.Config{})
				p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.SlidingWindowCounter, Limit: 100, Window: 10 * time.Second}
				if got := admit(t, l, p, "k", 100, ratelimit.ModeRedis); got != 100 {
					t.Fatalf("first window: %d of 100", got)
				}
				time.Sleep(15*time.Second - time.Since(time.Unix(946684800, 0)))
				synctest.Wait()
				if got := admit(t, l, p, "k", 1, ratelimit.ModeRedis); got != 1 {
					t.Fatal("the reply at 15 s refused")
				}
				if c.open {
					f.down.Store(true)
				} else {
					hang.Store(true)
				}
				settle(2500 * time.Millisecond)
				if got := admit(t, l, p, "k", 40, ratelimit.ModeLocal); got != c.want {
					t.Fatalf("%d local grants, want %d", got, c.want)
				}
				if closed := l.Breaker() == resilient.BreakerClosed; closed == c.open {
					t.Fatalf("breaker %s", l.Breaker())
				}
			})
		})
	}
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
		open.Name, open.FailureMode = "open", ratelimit.ModeOpen
		if got := admit(t, l, open, "k", 200, ratelimit.ModeOpen); got != 200 {
			t.Fatalf("fail open: %d of 200", got)
		}
		closed := base
		closed.Name, closed.FailureMode = "closed", ratelimit.ModeClosed
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
		if w := f.lastRequest.Load().Weight; w != (contract.Weight{Num: 4, Den: 3}) {
			t.Fatalf("weight %+v, want 4/3", w)
		}
		f.susp.Store(0)
		settle(time.Second) // next heartbeat
		if got := admit(t, l, p, "k", 100, ratelimit.ModeRedis); got != 25 {
			t.Fatalf("suspect gone: %d more admitted, want 25", got)
		}
	})
}

// TestRecoveringInstancesAreHeldBack: a closed instance holds back the token
// bucket and GCRA shares of the live instances still recovering (they grant
// from what is left of their shares, which their replays left in the
// store), as it does a suspect's, until a heartbeat says they closed; not
// the window algorithms'. Before, the first instance to close after an
// outage spent in Redis what the others still granted locally (redis-kill
// natively, without the fault proxy: one over the limit).
// TestShareIsOfTheHeldBackLimit: two of four instances are out and held
// back, so the two deciding in the store do so at half the limit. A call
// of theirs that times out with the breaker closed, or every call once
// their store is out too, is decided from their part of what that half
// leaves, not from a quarter of what the whole limit leaves: the store
// refuses past the half to every caller, and the shares of the two out
// are theirs (chaos redis-slow).
func TestShareIsOfTheHeldBackLimit(t *testing.T) {
	for _, c := range []struct {
		alg  ratelimit.Algorithm
		open bool
	}{
		{ratelimit.SlidingWindowLog, false}, {ratelimit.SlidingWindowCounter, false},
		{ratelimit.SlidingWindowLog, true}, {ratelimit.SlidingWindowCounter, true},
	} {
		alg := c.alg
		t.Run(fmt.Sprintf("%s/open=%v", alg, c.open), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				f.live.Store(2)
				f.susp.Store(2)
				hang := f.hangDecisions()
				l := newLimiter(t, f, resilient.Config{})
				p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: time.Hour}
				if got := admit(t, l, p, "k", 30, ratelimit.ModeRedis); got != 30 {
					t.Fatalf("in the store: %d of 30", got)
				}
				if c.open {
					f.down.Store(true)
				} else {
					hang.Store(true)
				}
				// The store leaves 50 - 30 = 20 to the two deciding in it.
				if got := admit(t, l, p, "k", 40, ratelimit.ModeLocal); got != 10 {
					t.Fatalf("%d local grants, want 10 (half of the 20 the held-back limit leaves)", got)
				}
				if closed := l.Breaker() == resilient.BreakerClosed; closed == c.open {
					t.Fatalf("breaker %s", l.Breaker())
				}
			})
		})
	}
}

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
			if w := f.lastRequest.Load().Weight; w != (contract.Weight{Num: 4, Den: 3}) {
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
			if w := f.lastRequest.Load().Weight; w != (contract.Weight{}) {
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
		if w := f.lastRequest.Load().Weight; w != (contract.Weight{}) {
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
