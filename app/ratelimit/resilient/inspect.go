// Inspect: what this instance holds of one key, read without counting.

package resilient

import (
	"math"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// KeyState is what a Limiter holds of one key under one policy (Inspect).
// The zero value holds nothing: the key is decided in the store.
type KeyState struct {
	// Share is the key's local share while the limiter decides the key
	// locally (the breaker is not closed, or a store call of the key failed
	// since its last reply); nil otherwise, and for a fail-open or
	// fail-closed policy, which has none. Remaining is how many units a
	// request could take from it now; ResetAfter, how long until it is
	// full again.
	Share *struct {
		Remaining  int64
		ResetAfter time.Duration
	}
	// RefusedUntil is when the store's last refusal of the key stops
	// answering its requests without a round trip (this instance's
	// clock); the zero Time: no cached refusal.
	RefusedUntil time.Time
	// Journaled is the units granted locally for the key that the store
	// does not have yet: not yet replayed, or in doubt.
	Journaled int64
}

// Inspect returns what the limiter holds of key under p: its local share,
// its cached refusal, the units journaled for it. It is safe for
// concurrent use and counts nothing: the share is worked out as a
// read-only request would find it, on a copy of the key's state, and a key
// the limiter does not hold is not added. An invalid policy or key holds
// nothing.
func (l *Limiter) Inspect(p ratelimit.Policy, key string) KeyState {
	if p.Validate() != nil || contract.ValidateKey(key) != nil {
		return KeyState{}
	}
	id := store.IdentityOf(key)
	k := l.keyOfIdentity(p, id)
	closed := l.br.State() == BreakerClosed
	part := share{n: float64(l.fleetSize()), factor: fallbackFactor(p), confirmed: l.confirmedAt()}
	if closed {
		part.confirmed = math.MaxInt64 // as decideLocal
	}
	now := l.storeNow()
	ks := KeyState{Journaled: l.journal.Held(p, id)}

	sh := l.keys.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// A copy: ensureLocal and decideLocal at cost 0 write only to it (the
	// log is resliced or copied, never written in place, at cost 0, and
	// rebuilt afresh when the share restarts).
	var c entry
	e, held := sh.lru.Peek(k)
	if held {
		c = *e
		if c.refusedUntil > now && c.policy != nil && *c.policy == p {
			ks.RefusedUntil = time.UnixMicro(c.refusedUntil - l.offset.load().us)
		}
	}
	live := held && c.localInit && !c.needsLocal(closed)
	if failureMode(p) != ratelimit.ModeLocal || closed && !live {
		return ks
	}
	if !held { // as rebuild, without counting a rebuild
		if snap, grants := l.journal.Key(p, id); snap != nil || len(grants) > 0 {
			c.startFrom(p, id, snap, part.n)
			for _, g := range grants {
				c.charge(p, g)
			}
		}
	}
	c.ensureLocal(p, now, part, closed, func() int64 { return l.hidden(&c, p, id) })
	d := c.decideLocal(p, now, 0, part)
	ks.Share = &struct {
		Remaining  int64
		ResetAfter time.Duration
	}{d.Remaining, d.ResetAfter}
	return ks
}
