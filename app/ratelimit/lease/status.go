// What a lease limiter tells about itself: its counters (Stats) and one
// key's lease (Inspect).

package lease

import (
	"time"
)

// Stats counts what the leases did.
type Stats struct {
	// Served: requests answered from a lease.
	Served uint64 `json:"served"`
	// Draws: leases taken; Refused: draws the store refused (the request
	// was then decided alone).
	Draws   uint64 `json:"draws"`
	Refused uint64 `json:"refused"`
	// Refunded: unused units given back; Lost: unused units not given
	// back (the store was out, or the refund failed).
	Refunded uint64 `json:"refunded_units"`
	Lost     uint64 `json:"unrefunded_units"`
	// Keys: keys followed; Held: leases held now, and Units their units.
	Keys  int   `json:"keys"`
	Held  int   `json:"held"`
	Units int64 `json:"units"`
}

// Stats returns the counters and what is held now.
func (l *Limiter) Stats() Stats {
	s := Stats{
		Served: l.stats.served.Load(), Draws: l.stats.draws.Load(), Refused: l.stats.refused.Load(),
		Refunded: l.stats.refunded.Load(), Lost: l.stats.lost.Load(),
	}
	l.mu.Lock()
	s.Keys = len(l.keys)
	for e := range l.held {
		if e.units > 0 {
			s.Held++
			s.Units += e.units
		}
	}
	l.mu.Unlock()
	return s
}

// Inspect returns the lease key holds under the policy named policy at
// this instance: the units left on it, counted in the store already, and
// when it ends (this instance's clock); ok is false when it holds none
// (none taken, spent, or ended). It is safe for concurrent use and counts
// nothing: the lease and the key's demand stay as they were.
func (l *Limiter) Inspect(policy, key string) (units int64, until time.Time, ok bool) {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.keys[leaseKey{policy, key}]
	if e == nil || e.units <= 0 || !now.Before(e.until) {
		return 0, time.Time{}, false
	}
	return e.units, e.until, true
}
