package resilient

import (
	"sync"
	"sync/atomic"
)

// State is the circuit breaker's state.
type State int32

// The breaker states.
const (
	// Closed: decisions go to the shared store.
	Closed State = iota
	// Open: the store is failing; decisions are local and a prober checks
	// the store in the background.
	Open
	// Recovering: the prober reached the store; the journal of local grants
	// is being replayed. Decisions stay local until it is done.
	Recovering
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case Recovering:
		return "recovering"
	}
	return "unknown"
}

// breaker counts consecutive failures and moves between the states. Reads of
// the state are one atomic load; transitions take a mutex.
type breaker struct {
	state     atomic.Int32
	threshold int
	onChange  func(from, to State, reason string)

	mu       sync.Mutex
	failures int
	opens    atomic.Uint64
}

func (b *breaker) State() State { return State(b.state.Load()) }

// success resets the failure count of a closed breaker.
func (b *breaker) success() {
	if b.State() != Closed {
		return
	}
	b.mu.Lock()
	b.failures = 0
	b.mu.Unlock()
}

// failure counts a failed call; the threshold-th consecutive one opens a
// closed breaker. A failure while recovering reopens it at once.
func (b *breaker) failure(reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.State() {
	case Closed:
		b.failures++
		if b.failures >= b.threshold {
			b.setLocked(Open, reason)
		}
	case Recovering:
		b.setLocked(Open, reason)
	}
}

// set moves the breaker to state to, if it is in state from.
func (b *breaker) set(from, to State, reason string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.State() != from {
		return false
	}
	b.setLocked(to, reason)
	return true
}

func (b *breaker) setLocked(to State, reason string) {
	from := b.State()
	if from == to {
		return
	}
	b.failures = 0
	if to == Open {
		b.opens.Add(1)
	}
	b.state.Store(int32(to))
	if b.onChange != nil {
		b.onChange(from, to, reason)
	}
}
