package resilient_test

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// TestWallClockStepDoesNotMoveTheFallback: during an outage the wall clock
// jumps forward by a window and later back; the local shares go on at the
// rate time really passes: the jump refills nothing and ages nothing out,
// and the step back locks nothing.
func TestWallClockStepDoesNotMoveTheFallback(t *testing.T) {
	for _, alg := range ratelimit.Algorithms {
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
