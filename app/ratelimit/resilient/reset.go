// Resets: an operator lifts one identity's limits, in the store and in
// every instance's memory.

package resilient

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// ErrResetPartial is the error of a reset that holds on this instance
// only: the store is out, or cannot reset for the fleet. Sending the same
// reset again once the store is back completes it.
var ErrResetPartial = errors.New("resilient: the reset holds on this instance only")

// maxReapply bounds the resets waiting to be applied a second time.
const maxReapply = 4096

// resets is a Limiter's part of the fleet's resets.
type resets struct {
	// after is the id of the last reset log entry read; "" until the
	// first read. Owned by the loop goroutine (heartbeats, replays).
	after string
	// read is the store's time (µs) of the last read of the log, every
	// reset read then applied: a replay's store.ReplayBatch.ResetsRead.
	read    atomic.Int64
	applied atomic.Uint64

	mu sync.Mutex
	// again are resets applied once, to apply once more when due: a
	// reply to a decision sent before the store dropped the state can
	// arrive after the first application and bring a refusal back.
	again []reapply
}

type reapply struct {
	policy   ratelimit.Policy
	identity store.Identity
	due      time.Time
}

// Reset lifts identity's limits under policies: in the store, and in what
// every instance holds of it (cached refusals, snapshots, fallback shares)
// within one heartbeat; on this instance at once. An invalid identity or
// policy is an error (ratelimit.ErrInvalidRequest or ErrInvalidPolicy) and
// nothing is reset. While the store is out the reset holds on this instance
// only: the error wraps ErrResetPartial and says why. Grants this instance
// journaled for the identity are dropped with it (counted as dropped):
// replayed, they would bring back the usage the reset lifted. Safe for
// concurrent use.
func (l *Limiter) Reset(ctx context.Context, identity string, policies ...ratelimit.Policy) error {
	if err := contract.ValidateKey(identity); err != nil {
		return err
	}
	if len(policies) == 0 {
		return fmt.Errorf("%w: no policy to reset", ratelimit.ErrInvalidRequest)
	}
	for _, p := range policies {
		if err := p.Validate(); err != nil {
			return err
		}
	}
	id := store.IdentityOf(identity)
	for _, p := range policies {
		// Every grant journaled so far is from before the reset.
		l.forget(p, id, math.MaxInt64)
		l.reapplyLater(p, id)
	}
	var partial error
	r, ok := l.ext.(contract.Resetter)
	switch {
	case !ok:
		partial = errors.New("the store cannot reset for the fleet")
	case l.br.State() == BreakerOpen:
		partial = errors.New("the store is out (breaker open)")
	default:
		// Two round trips: the delete, then the log.
		callCtx, cancel := context.WithTimeout(ctx, 2*l.cfg.Timeout)
		partial = r.Reset(callCtx, identity, policies...)
		cancel()
	}
	if partial == nil {
		return nil // counted when read back from the log
	}
	l.resets.applied.Add(uint64(len(policies)))
	return fmt.Errorf("%w: %w", ErrResetPartial, partial)
}

// pollResets applies the resets logged since the last read (the heartbeat
// calls it), and the second applications that are due.
func (l *Limiter) pollResets(ctx context.Context) {
	if _, ok := l.ext.(contract.Resetter); !ok {
		return
	}
	now := l.clock.now()
	l.resets.mu.Lock()
	var due []reapply
	kept := l.resets.again[:0]
	for _, a := range l.resets.again {
		if now.Before(a.due) {
			kept = append(kept, a)
		} else {
			due = append(due, a)
		}
	}
	l.resets.again = kept
	l.resets.mu.Unlock()
	for _, a := range due {
		l.forgetRefusal(a.policy, a.identity)
	}
	_ = l.readResets(ctx)
}

// readResets applies the resets logged since the last read and records the
// store's time of the read (resets.read).
func (l *Limiter) readResets(ctx context.Context) error {
	r, ok := l.ext.(contract.Resetter)
	if !ok {
		return nil
	}
	callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	after, read, err := r.ReadResets(callCtx, l.resets.after, l.applyReset)
	cancel()
	if after != "" {
		l.resets.after = after
	}
	if err != nil {
		if ctx.Err() == nil {
			l.cfg.Logger.Debug("reading the reset log", "error", err.Error())
		}
		return err
	}
	l.resets.read.Store(read)
	return nil
}

// applyReset applies a reset made at store time at, read from the log: it
// forgets what this instance holds of identity id under policy p and the
// grants it journaled before at, and forgets once more, a Timeout later,
// a refusal that a reply to a decision sent before the reset may bring
// back.
func (l *Limiter) applyReset(p ratelimit.Policy, id store.Identity, at int64) {
	l.forget(p, id, at)
	l.resets.applied.Add(1)
	l.reapplyLater(p, id)
}

// reapplyLater has the next heartbeat a Timeout from now forget the key
// again (see resets.again).
func (l *Limiter) reapplyLater(p ratelimit.Policy, id store.Identity) {
	l.resets.mu.Lock()
	if len(l.resets.again) >= maxReapply {
		l.resets.again = l.resets.again[1:]
	}
	l.resets.again = append(l.resets.again, reapply{policy: p, identity: id, due: l.clock.now().Add(l.cfg.Timeout)})
	l.resets.mu.Unlock()
}

// forget empties the key's entry, as if it had never been seen: no cached
// refusal, no snapshot, a fresh fallback share; and drops the grants it
// journaled at or before through (store µs). In place, not removed: a
// removal would count as an eviction.
func (l *Limiter) forget(p ratelimit.Policy, id store.Identity, through int64) {
	// Its local grants from before the reset are usage the reset lifts:
	// not to be replayed. Those made after it (a cut-off instance hears of
	// a reset only once it is back) are usage it did not lift.
	l.journal.Drop(p, id, through)
	k := l.keyOfIdentity(p, id)
	sh := l.keys.shard(k)
	sh.mu.Lock()
	if e, ok := sh.lru.Peek(k); ok {
		*e = entry{}
	}
	sh.mu.Unlock()
	if f := l.onForget.Load(); f != nil {
		(*f)(p, id)
	}
}

// forgetRefusal drops the key's cached refusal: the second application of
// a reset, for a reply to a decision sent before it that came back after
// the first. The key's journal and local share stay: what it granted since
// the reset is real usage, and a second fresh share would grant the reset's
// quota twice.
func (l *Limiter) forgetRefusal(p ratelimit.Policy, id store.Identity) {
	k := l.keyOfIdentity(p, id)
	sh := l.keys.shard(k)
	sh.mu.Lock()
	if e, ok := sh.lru.Peek(k); ok {
		e.refusedUntil, e.refusedCost, e.refusedW = 0, 0, contract.Weight{}
		e.resendID, e.resendUntil = "", 0
	}
	sh.mu.Unlock()
}

// setOnForget has f called whenever this instance forgets what it holds of a
// key (a reset), so that a layer above it forgets its own (package lease:
// the key's lease). f must not block.
func (l *Limiter) setOnForget(f func(ratelimit.Policy, store.Identity)) {
	l.onForget.Store(&f)
}
