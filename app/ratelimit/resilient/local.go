// The local path: decisions from the key's share of what the store last
// said was left while the breaker is not closed, and what keeps a share
// from granting twice: the grants the snapshot does not show yet (hidden,
// synced), a forgotten key rebuilt from the journal, an evicted key's
// snapshot kept, the fleet's size the share divides by.

package resilient

import (
	"errors"
	"math"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient/internal/journal"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// decideLocal decides req from the key's local share. until (not zero):
// the store still has the request's call (it timed out), and will say
// whether it counted it. Its answer is awaited until then, and taken if it
// comes: a slow store's late answer is exact, where a local share beside a
// store that goes on deciding can grant what the store grants too, and
// refuse what it admitted (and counted). Past that, a grant is a doubt
// until the store says (late.go).
func (l *Limiter) decideLocal(k key, id store.Identity, req contract.Request, until time.Time) contract.Decision {
	pending := !until.IsZero()
	if pending && !req.ReadOnly {
		if sd, ok := l.awaitLate(req, until); ok {
			return sd
		}
	}
	l.stats.localDecisions.Add(1)
	p := req.Policy
	if p.Algorithm == ratelimit.SlidingWindowLog {
		req = l.withID(req)
	}
	now := l.storeNow()
	var d contract.Decision
	switch failureMode(p) {
	case ratelimit.ModeOpen:
		d = contract.Decision{Decision: ratelimit.Decision{Allowed: true, Limit: p.Capacity(), Remaining: p.Capacity(), Mode: ratelimit.ModeOpen}}
	case ratelimit.ModeClosed:
		// Refused as any local refusal: a store that admitted it late
		// gets the refund below (TestFailClosedRefundsALateAdmission).
		d = contract.Decision{Decision: ratelimit.Decision{Limit: p.Capacity(), RetryAfter: l.cfg.ProbeInterval, ResetAfter: l.cfg.ProbeInterval, Mode: ratelimit.ModeClosed}}
	default:
		// The weight: while others are held back, the store decides at
		// the limit they leave, and what it shows used is of that limit.
		part := share{n: float64(l.fleetSize()), factor: fallbackFactor(p), confirmed: l.confirmedAt(), weight: l.weight(p.Algorithm)}
		closed := l.br.State() == BreakerClosed
		if closed {
			// The store still decides (this call timed out, or waits
			// behind a probe), and grants whatever refills or ages out:
			// the share has only what the snapshot showed left
			// (TestLateGrantOfAnUnseenKeyIsChargedInFull).
			part.confirmed = math.MaxInt64
		}
		sh := l.keys.shard(k)
		sh.mu.Lock()
		e, fresh := sh.get(k)
		if fresh {
			l.rebuild(e, p, id)
		}
		if e.policy == nil || *e.policy != p {
			e.policy = l.keys.policyRef(p)
		}
		e.identity = id
		e.ensureLocal(p, now, part, closed, func() int64 { return l.hidden(e, p, id) })
		d = e.decideLocal(p, now, req.Units(), part)
		if d.Allowed && !req.ReadOnly && !e.journaled {
			// What this share started from, before its first grant, so a
			// restart rebuilds it.
			e.journaled = true
			_ = l.journal.AppendSnapshot(journal.Snapshot{Policy: p, Identity: id, State: e.snap, Valid: e.snapValid, N: e.n, Confirmed: e.confirmed})
		}
		sh.mu.Unlock()
	}
	if !d.Allowed {
		if pending && !req.ReadOnly {
			l.late.refuse(req, now)
		}
		return d
	}
	if req.ReadOnly { // it took nothing
		return d
	}
	// Journaled before the response is sent; a failed write is counted
	// and logged by the journal itself. A full journal refuses the grant:
	// a grant the journal cannot hold would never reach the store.
	g := store.Grant{At: now, Cost: req.Units(), ID: req.ID}
	if err := l.journalGrant(p, id, g, pending); errors.Is(err, journal.ErrFull) {
		return contract.Decision{Decision: ratelimit.Decision{Limit: p.Capacity(), RetryAfter: l.cfg.ProbeInterval, ResetAfter: l.cfg.ProbeInterval,
			Mode: d.Mode}, State: d.State}
	}
	return d
}

// hidden is what the key holds that the store does not show in e's
// snapshot: the grants the journal holds for it (not yet replayed, or
// doubts), and those replayed after the snapshot was taken. The shard's
// lock is held.
func (l *Limiter) hidden(e *entry, p ratelimit.Policy, id store.Identity) int64 {
	n := l.journal.Held(p, id)
	if e.syncedUnits > 0 {
		if e.snapValid && e.snap.Now >= e.syncedAt {
			e.syncedUnits = 0 // the snapshot has them
		}
		n += e.syncedUnits
	}
	return n
}

// synced records that the store took units of the key of p and id at
// store time at (a replay, or a late reply that found them counted): until
// a snapshot as recent, a fresh local share must still count them.
func (l *Limiter) synced(p ratelimit.Policy, id store.Identity, units, at int64) {
	k := l.keyOfIdentity(p, id)
	sh := l.keys.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.lru.Peek(k)
	if !ok {
		return
	}
	e.syncedUnits += units
	e.syncedAt = max(e.syncedAt, at)
	// The journal lets go of a key's snapshot with its last grant: the
	// next local grant journals it again.
	e.journaled = false
}

// rebuild starts a fresh entry (one the table had forgotten: evicted, or
// never seen) from what the journal holds of its key, as a restart does: a
// key evicted during an outage comes back with no more than it had
// (TestFloodDoesNotResetAHotKey). The shard's lock is held.
func (l *Limiter) rebuild(e *entry, p ratelimit.Policy, id store.Identity) {
	snap, grants := l.journal.Key(p, id)
	if snap == nil && len(grants) == 0 {
		return
	}
	l.stats.rebuilt.Add(1)
	e.startFrom(p, id, snap, float64(l.fleetSize()))
	for _, g := range grants {
		e.charge(p, g)
	}
	e.journaled = snap != nil
}

// evicted is called for each entry a full shard evicts, with its lock held.
// While the store is out, a key's local state must survive its eviction:
// its grants are in the journal already; a key whose share started from a
// snapshot and granted nothing yet (a spent key, refused locally) leaves
// the snapshot there, so that it does not come back with a fresh share.
func (l *Limiter) evicted(_ key, e *entry) {
	l.stats.evictions.Add(1)
	if l.br.State() == BreakerClosed || e.journaled || !e.snapValid || e.policy == nil {
		return
	}
	n, confirmed := float64(l.fleetSize()), l.confirmedAt()
	if e.localInit && e.localVersion == e.version {
		n, confirmed = e.n, e.confirmed
	}
	if l.journal.AppendSnapshot(journal.Snapshot{Policy: *e.policy, Identity: e.identity, State: e.snap, Valid: true, N: n, Confirmed: confirmed}) == nil {
		l.stats.spilled.Add(1)
	}
}

// fleetSize is the number of instances that may be granting: live and
// suspect, as the last heartbeat said; ExpectedInstances before the first.
func (l *Limiter) fleetSize() int64 {
	if !l.fleetSeen.Load() {
		return int64(l.cfg.ExpectedInstances)
	}
	return max(1, l.live.Load()+l.suspect.Load())
}

// failureMode is p's FailureMode, with the default (ModeLocal) filled in.
func failureMode(p ratelimit.Policy) ratelimit.Mode {
	if p.FailureMode == "" {
		return ratelimit.ModeLocal
	}
	return p.FailureMode
}

// fallbackFactor is p's FallbackFactor, with the default (1) filled in.
func fallbackFactor(p ratelimit.Policy) float64 {
	if p.FallbackFactor == 0 {
		return 1
	}
	return p.FallbackFactor
}
