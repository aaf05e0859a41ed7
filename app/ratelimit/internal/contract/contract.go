// Package contract is the part of the store contract that only this
// module's stores implement: the optional interfaces through which a
// resilient.Limiter takes a store further into the recovery (suspending an
// instance, refunding late admissions, raising keys a failover lost,
// fleet-wide resets), and the values they exchange.
//
// A store outside the module implements store.Store; resilient finds the
// interfaces below on the store's extension (Extension) by type assertion,
// and does without those it lacks.
package contract

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

var (
	mu         sync.RWMutex
	extensions []func(ratelimit.Limiter) (any, bool)
)

// Register adds a finder of extensions: a store package registers, in its
// init, a function that returns the value carrying its optional
// interfaces for a store of its own type.
func Register(find func(ratelimit.Limiter) (any, bool)) {
	mu.Lock()
	defer mu.Unlock()
	extensions = append(extensions, find)
}

// Extension returns what carries l's optional interfaces: the value a
// registered finder returns for it, else l itself.
func Extension(l ratelimit.Limiter) any {
	mu.RLock()
	defer mu.RUnlock()
	for _, find := range extensions {
		if x, ok := find(l); ok {
			return x
		}
	}
	return l
}

// ErrPending: the caller stopped waiting (its context ended) while the
// store still had the call; a store that returns it (one with a
// LateReporter registered) reports what became of the call as a LateReply.
// Stores wrap it; test with errors.Is.
var ErrPending = errors.New("rate-limit decision pending in the store")

// Suspender is a Store that can mark an instance as deciding locally.
// When its breaker opens, a resilient.Limiter suspends itself (best
// effort: the store may well be out), so that the other instances hold its
// share back at once instead of after its heartbeat's TTL.
type Suspender interface {
	Suspend(ctx context.Context, instance string, ttl, grace time.Duration) error
}

// Warmer is a Store that can open n connections ahead of the first
// decisions. A resilient.Limiter warms it at start and at every recovery,
// so that the first decisions after an outage do not each pay a dial.
type Warmer interface {
	Warm(ctx context.Context, n int)
}

// LateReporter is a Store that reports what became of the calls whose
// callers stopped waiting (see LateReply). OnLate reports false when it
// cannot. With it, a resilient.Limiter learns that a decision it gave up
// on ran in the store after all: an admission it had refused locally is
// refunded (with a Refunder), and one it had granted locally is dropped
// from the journal instead of replayed (which would count it twice).
type LateReporter interface {
	OnLate(window time.Duration, fn func(LateReply)) bool
}

// Refunder is a Store that can undo what it counted for a request it
// admitted, and returns the units it gave back. With a LateReporter, a
// resilient.Limiter refunds the admissions the store made after their
// callers had been refused locally, so that a slow store does not charge
// clients for requests they were refused.
type Refunder interface {
	Refund(ctx context.Context, req ratelimit.Request, d ratelimit.Decision) (int64, error)
}

// Sharded is a Store whose keys live on several nodes that fail
// independently (redisstore on a Redis Cluster) when Sharded reports true.
// A resilient.Limiter then takes a refused call as one node down rather
// than the store, and goes on calling the others.
type Sharded interface {
	Sharded() bool
}

// Stager is a Store that keeps each instance's recovery stage beside its
// heartbeat and returns the live instances' stages in Fleet.Stages. With
// it, a resilient.Limiter decides in the store again only once every live
// instance has put back what the store lost; without it, each instance
// recovers on its own.
type Stager interface {
	HeartbeatStage(ctx context.Context, instance string, ttl, grace time.Duration, stage string) (store.Fleet, error)
}

// Lossy is a Store that can say what a change of its data generation from
// old to new lost of each key: all of it (a wipe; on a Cluster, only the
// keys of the masters that lost theirs) or its recent writes. Without it,
// a resilient.Limiter takes every key as wiped.
type Lossy interface {
	Loss(old, new string) func(ratelimit.Policy, store.Identity) Loss
}

// Raiser is a Store that can raise keys to floors (see Floor). With it, a
// key that lost only its recent writes (LossRecent) is raised to what the
// instances last saw instead of having that usage added, which would count
// the part that survived twice.
type Raiser interface {
	Raise(ctx context.Context, floors []Floor) ([]int64, []error)
}

// Resetter is a Store that can lift an identity's limits for the whole
// fleet: Reset drops the identity's state and logs the reset, and
// ReadResets hands the resets logged after a cursor to every instance
// (apply is called for each) and returns the new cursor. Without it, a
// resilient.Limiter's Reset holds on its own instance only.
//
// A reset's time is the store's (µs) when it was logged; apply gets it, so
// that an instance drops from its journal only the grants made before the
// reset. ReadResets also returns the store's time of the read, for
// ReplayBatch.ResetsRead.
type Resetter interface {
	Reset(ctx context.Context, identity string, policies ...ratelimit.Policy) error
	ReadResets(ctx context.Context, after string, apply func(p ratelimit.Policy, id store.Identity, at int64)) (cursor string, read int64, err error)
}

// ErrFenced is a replay batch's error from a store that keeps resets: its
// key was reset after the batch's ResetsRead. Read the reset log again,
// apply it to the journal, and send what is left.
var ErrFenced = errors.New("store: the key was reset after the resets the replay knew of")

// Floor is the least usage a key is known to hold: the state a store's
// reply showed an instance. A store that lost writes it had acknowledged (a
// replica promoted while behind its master) is raised back to the floors the
// instances hold: each key ends up with at least the floor's usage and keeps
// whatever it holds beyond it, so raising twice, or to several instances'
// floors, is harmless.
type Floor struct {
	Policy   ratelimit.Policy
	Identity store.Identity
	State    ratelimit.State
}

// Loss says what a change of a store's data generation lost of one key.
type Loss int

const (
	// LossNone: the key's data is intact.
	LossNone Loss = iota
	// LossAll: the store lost all of the key's data (restarted empty,
	// flushed): its usage is put back by adding it.
	LossAll
	// LossRecent: the store lost only its most recent writes (a replica
	// promoted while behind, an AOF that lost its last second): the key is
	// raised to its floor (see Floor).
	LossRecent
)

// LateReply is what became of a store call whose caller stopped waiting
// (its context ended) before the answer came: a store that reports them
// (redisstore with coalescing) keeps reading the reply and hands it over
// once it has it, so that a decision the store made, and counted, is never
// lost between the store and its caller.
type LateReply struct {
	Request ratelimit.Request
	// Decision is the store's answer when Err is nil: the store decided
	// the request, and counted it if it was allowed.
	Decision ratelimit.Decision
	// Err says why there is no answer. With NotSent the call never reached
	// the store, which did not count it; otherwise the store may or may not
	// have (the reply was lost, or did not come within the store's window).
	Err     error
	NotSent bool
}

// Leasable is a limiter that lends units out safely only at times: the
// lease layer takes leases while InStore reports true (a resilient.Limiter
// whose breaker is closed), and forgets a key's lease when OnForget's
// function is called for it (an operator's reset of the key).
type Leasable interface {
	InStore() bool
	OnForget(f func(ratelimit.Policy, store.Identity))
}
