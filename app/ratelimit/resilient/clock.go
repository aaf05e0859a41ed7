// Time: the limiter's local clock, and its estimate of the store's.

package resilient

import (
	"sync/atomic"
	"time"
)

// localClock is the limiter's local time: the wall clock read once, at New,
// then advanced by the monotonic clock. A step of the wall clock (an NTP
// correction, a resumed VM, an operator's date) does not move it, so the
// fallback's refill and ageing, the breaker's windows and the journal's
// grant times go on at the rate time really passes
// (TestWallClockStepDoesNotMoveTheFallback).
type localClock struct {
	start time.Time // the wall clock at New, without its monotonic reading
	mono  time.Time // time.Now() at New: its monotonic reading measures from here
}

func newLocalClock(wall time.Time) localClock {
	return localClock{start: wall.Round(0), mono: time.Now()}
}

// now returns the local time.
func (c localClock) now() time.Time { return c.start.Add(time.Since(c.mono)) }

// storeOffset is the store's clock minus the local one, and how far off
// that may be (half the round trip it was learned from), both in µs. It is
// replaced whole, so a reader never pairs one reply's offset with another's
// error.
type storeOffset struct {
	us, errUS int64
}

// offsetHolder holds the latest storeOffset.
type offsetHolder struct{ p atomic.Pointer[storeOffset] }

func (h *offsetHolder) load() storeOffset {
	if o := h.p.Load(); o != nil {
		return *o
	}
	return storeOffset{}
}

func (h *offsetHolder) store(o storeOffset) { h.p.Store(&o) }
