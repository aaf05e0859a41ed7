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
// that may be (half the round trip it was learned from), both in µs, and
// when it was learned (local µs). It is replaced whole, so a reader never
// pairs one reply's offset with another's error.
type storeOffset struct {
	us, errUS int64
	at        int64
}

// offsetDriftPPM is how fast an offset's error is taken to grow with its
// age (µs per second): the two clocks drift apart, and the store's may be
// slewed. Generous, so that a tight offset gives way to fresh ones within
// seconds.
const offsetDriftPPM = 1000

// errAt is o's error at local time now (µs), grown with its age. An offset
// never learned (the zero value: no reply yet, as for an instance started
// during an outage) is this host's clock, with no error to go by: grown
// from the epoch, its error put the replay's time in 1970, and the
// instance's charges at its last grants.
func (o storeOffset) errAt(now int64) int64 {
	if o.at == 0 {
		return 0
	}
	return o.errUS + max(0, now-o.at)*offsetDriftPPM/1_000_000
}

// offsetHolder holds the tightest storeOffset learned: a reply whose round
// trip was long (a loaded host wakes its caller late; a shared pipeline
// wakes its callers in any order) says little about the store's clock, and
// taken as is it would put the journal's grant times milliseconds off the
// store's, on the wrong side of a reset made meanwhile (offer).
type offsetHolder struct{ p atomic.Pointer[storeOffset] }

// offer keeps n when it is tighter than the offset held (its error aged
// to n's time), or when the two cannot both be right (their ranges do not
// overlap: the store's clock stepped), and else the offset held.
func (h *offsetHolder) offer(n storeOffset) {
	for {
		o := h.p.Load()
		if o != nil {
			oerr := o.errAt(n.at)
			if n.errUS > oerr && abs64(n.us-o.us) <= n.errUS+oerr {
				return
			}
		}
		if h.p.CompareAndSwap(o, &n) {
			return
		}
	}
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

func (h *offsetHolder) load() storeOffset {
	if o := h.p.Load(); o != nil {
		return *o
	}
	return storeOffset{}
}
