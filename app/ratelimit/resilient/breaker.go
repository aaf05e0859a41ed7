package resilient

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is the circuit breaker's state, as Status reports it.
type BreakerState string

// The breaker states.
const (
	// BreakerClosed: decisions go to the shared store.
	BreakerClosed BreakerState = "closed"
	// BreakerOpen: the store is failing; decisions are local and a prober
	// checks the store in the background.
	BreakerOpen BreakerState = "open"
	// BreakerRecovering: the prober reached the store; the journal of local
	// grants is being replayed. Decisions stay local until it is done.
	BreakerRecovering BreakerState = "recovering"
)

// breakerStates are the states by their number in breaker.state.
var breakerStates = [...]BreakerState{BreakerClosed, BreakerOpen, BreakerRecovering}

// stateNumber is s's number in breaker.state.
func stateNumber(s BreakerState) int32 { return int32(slices.Index(breakerStates[:], s)) }

// breaker counts consecutive failures and moves between the states. Reads of
// the state are one atomic load; a success is two atomic operations on the
// hot path (no lock); transitions take a mutex.
//
// A dead store and a slow one are told apart by what a failure is:
//   - an error the store or the network answered with (connection refused or
//     reset, a write refused) is a hard failure: threshold consecutive ones
//     open the breaker at once;
//   - a timeout is ambiguous: a busy store answers late, and when calls are
//     concurrent, one stall times out many of them together. Timeouts open
//     the breaker only once threshold consecutive failures have been seen and
//     nothing has succeeded for slowWindow. A store that still answers some
//     calls (or the heartbeat) within the timeout is slow, not dead: the
//     calls that time out are decided locally one by one, and the breaker
//     stays closed.
type breaker struct {
	state      atomic.Int32
	threshold  int
	slowWindow time.Duration
	// stallAfter is how long without a success makes failing calls a
	// stalled store, probed one call at a time (admit): two timeouts.
	stallAfter time.Duration
	now        func() time.Time
	onChange   func(from, to BreakerState, reason string)

	failures    atomic.Int64
	lastSuccess atomic.Int64 // local Unix µs of the last success while closed
	// probing: a store call is checking a suspect store (see admit).
	probing atomic.Bool
	// refused: the last failure was one the store or the network answered
	// with (see admit); a success clears it. Not on a sharded store.
	refused      atomic.Bool
	shardedStore bool

	mu    sync.Mutex
	opens atomic.Uint64
}

func (b *breaker) State() BreakerState { return breakerStates[b.state.Load()] }

// success records that the store answered, and resets the failure count of
// a closed breaker.
func (b *breaker) success() {
	b.lastSuccess.Store(b.now().UnixMicro())
	if b.refused.Load() {
		b.refused.Store(false)
	}
	if b.State() != BreakerClosed {
		return
	}
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
}

// alive records that the store answered a call late: it is slow, not
// stalled or dead (admit, failure), though the call failed.
func (b *breaker) alive() { b.lastSuccess.Store(b.now().UnixMicro()) }

// quietFor reports whether no call has succeeded for d.
func (b *breaker) quietFor(d time.Duration) bool {
	return b.now().UnixMicro()-b.lastSuccess.Load() >= d.Microseconds()
}

// admit says whether a decision may call the store while the breaker is
// closed. Normally every one may. A closed breaker whose last threshold
// calls all failed (a store that stalls, not yet long enough to open it)
// lets one call at a time through, as a probe, and the rest are decided
// locally at once instead of each waiting out the timeout: without this, a
// paused or partitioned store would hold every request for the full
// timeout until the breaker opened. A refused call (a hard failure: the connection
// reset or refused) makes the store suspect at once: when Redis dies, the
// calls in flight fail with EOF, and the next ones dial an address that no
// longer answers, each waiting out the timeout until three timeouts are counted
// where a dead host's address drops packets (TestRefusedCallProbesAtOnce,
// TestSuspectStoreIsNotWaitedFor). A success (a call's or a heartbeat's)
// ends it. Not on a sharded store (a Redis Cluster): there one master
// refusing says nothing of the others, and with calls to the healthy
// masters succeeding in between, the refusals to the dead one would make
// decisions local while the breaker stays closed and the fleet holds no
// share back (TestRefusedCallOnAShardedStore). A probe must call done when
// its call returns.
func (b *breaker) admit() (ok, probe bool) {
	if b.failures.Load() < int64(b.threshold) && !b.refused.Load() {
		return true, false
	}
	if !b.refused.Load() && !b.quietFor(b.stallAfter) {
		// Calls time out, but others succeed: a slow store, not a
		// stalled one. Every call goes on to it: a late answer still
		// counts (late replies), where a probe's wait sent the rest
		// to a local share with nothing to refill it
		// (TestSlowStoreIsStillAsked).
		return true, false
	}
	if b.probing.CompareAndSwap(false, true) {
		return true, true
	}
	return false, false
}

// done ends a probe (see admit).
func (b *breaker) done() { b.probing.Store(false) }

// trip opens a closed breaker at once, whatever the count: a heartbeat the
// store refused (see Limiter.heartbeat).
func (b *breaker) trip(reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.State() == BreakerClosed {
		b.failures.Store(int64(b.threshold))
		b.setLocked(BreakerOpen, reason)
	}
}

// failure counts a failed call (timeout: it outlived its deadline); the
// threshold-th consecutive one opens a closed breaker, for a timeout only if
// nothing succeeded for slowWindow. A failure while recovering reopens it at
// once, but for a timeout while the store answers other calls (it is busy
// with the fleet's replays, say): slow, not dead.
func (b *breaker) failure(reason string, timeout bool) {
	switch b.State() {
	case BreakerClosed:
		if !timeout && !b.shardedStore {
			b.refused.Store(true)
		}
		n := b.failures.Add(1)
		if n < int64(b.threshold) {
			return
		}
		if timeout && b.now().UnixMicro()-b.lastSuccess.Load() < b.slowWindow.Microseconds() {
			return // slow, not dead
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.State() == BreakerClosed && b.failures.Load() >= int64(b.threshold) {
			b.setLocked(BreakerOpen, reason)
		}
	case BreakerRecovering:
		if timeout && b.now().UnixMicro()-b.lastSuccess.Load() < b.slowWindow.Microseconds() {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.State() == BreakerRecovering {
			b.setLocked(BreakerOpen, reason)
		}
	}
}

// set moves the breaker to state to, if it is in state from.
func (b *breaker) set(from, to BreakerState, reason string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.State() != from {
		return false
	}
	b.setLocked(to, reason)
	return true
}

func (b *breaker) setLocked(to BreakerState, reason string) {
	from := b.State()
	if from == to {
		return
	}
	b.failures.Store(0)
	b.refused.Store(false)
	if to == BreakerClosed {
		b.lastSuccess.Store(b.now().UnixMicro())
	}
	if to == BreakerOpen {
		b.opens.Add(1)
	}
	b.state.Store(stateNumber(to))
	if b.onChange != nil {
		b.onChange(from, to, reason)
	}
}
