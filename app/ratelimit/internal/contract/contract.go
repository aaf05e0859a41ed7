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
	"fmt"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/keycheck"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// Algorithms lists every algorithm the module implements.
var Algorithms = []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter, ratelimit.GCRA}

var (
	mu         sync.RWMutex
	extensions []func(ratelimit.Limiter) (any, bool)
)

// Register makes ext(l) the extension of every limiter l of type T: a
// store package registers, in its init, what carries its optional
// interfaces for a store of its own type.
func Register[T ratelimit.Limiter](ext func(T) any) {
	mu.Lock()
	defer mu.Unlock()
	extensions = append(extensions, func(l ratelimit.Limiter) (any, bool) {
		t, ok := l.(T)
		if !ok {
			return nil, false
		}
		return ext(t), true
	})
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

// Cutoff is a Store that keeps, for the fleet, the time from which every
// recovering instance charges its local grants in full (store µs). The
// store refills a token bucket or GCRA key at the whole rate from the first
// charge of a recovery on, while each share that has not replayed yet
// counts only its own part of that refill, up to its capacity: charged net
// of refill up to their own replays, the grants of the instances that
// replay later would spend refill the store credits as well. Cutoff
// returns the cutoff, which the first call of a recovery sets to the
// store's clock (a cutoff older than staleBefore is an earlier recovery's,
// or too old for the caller to date its charges from, and is replaced),
// and the store's clock at the call.
type Cutoff interface {
	Cutoff(ctx context.Context, staleBefore int64) (cutoff, now int64, err error)
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
	Refund(ctx context.Context, req Request, d Decision) (int64, error)
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
	State    State
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
	Request Request
	// Decision is the store's answer when Err is nil: the store decided
	// the request, and counted it if it was allowed.
	Decision Decision
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

// Weight scales what a request takes, so that a decider can hold back part
// of a policy for instances that may be deciding elsewhere (a partitioned
// instance spending its fallback share). With Weight{Num: n, Den: d} the
// decider admits as if it had d/n of the policy: the token bucket and GCRA
// charge cost × n/d (so both the burst and the rate shrink), the window
// algorithms admit up to ⌊limit × d/n⌋. The zero value is {1, 1}: the whole
// policy.
type Weight struct {
	Num, Den int64
}

// Valid reports whether w is the zero value or 1 <= Den <= Num <= 1024.
func (w Weight) Valid() bool {
	return w == Weight{} || w.Den >= 1 && w.Den <= w.Num && w.Num <= 1024
}

// State is an algorithm's state after a decision, as a store reports it.
// Only the fields of the policy's algorithm are set.
type State struct {
	// Now is the deciding store's time, µs since the Unix epoch (Redis
	// TIME for the Redis store).
	Now int64
	// Tokens is the token bucket's level, scaled by the window in µs
	// (tokens × Window µs), so refills stay integral.
	Tokens int64
	// TAT is GCRA's theoretical arrival time: TAT µs since the epoch plus
	// TATRem/Limit µs.
	TAT, TATRem int64
	// WindowStart, Current and Previous are the sliding window counter's
	// aligned window (µs since the epoch) and the counts of it and the one
	// before.
	WindowStart, Current, Previous int64
	// Ages is the sliding window log's histogram: Ages[i] grants are between
	// i and i+1 eighths of a window old.
	Ages [AgeBuckets]int64
}

// AgeBuckets is the resolution of the sliding window log's age histogram.
const AgeBuckets = 8

// Request is a request as the layers pass it to a store of this module.
type Request struct {
	ratelimit.Request
	// Weight holds back part of the policy for instances deciding
	// elsewhere; the zero value decides with the whole policy.
	Weight Weight
	// Hold asks for units that will be used at any time within Hold of
	// the decision (a lease, package lease), and so are counted as used at
	// its end: GCRA's theoretical arrival time moves to at least the
	// decision's time plus Hold before the cost is added. Admitted so, no
	// use of the units within Hold can exceed what GCRA admits over any
	// interval. The Redis store honours it (GCRA only); other stores do not
	// get it, and the lease layer takes no lease from them. At most the
	// window or the time the policy takes to refill its capacity,
	// whichever is longer (a lease, at most a quarter of that refill time,
	// may outlive the window when the burst exceeds the limit); 0 for
	// other algorithms.
	Hold time.Duration
}

// Validate checks the request as ratelimit.Request.Validate does, and its
// hold and weight.
func (r Request) Validate() error {
	if err := r.Request.Validate(); err != nil {
		return err
	}
	p := r.Policy
	refill := time.Duration(float64(p.Window) * float64(p.Capacity()) / float64(p.Limit))
	if most := max(p.Window, refill); r.Hold < 0 || r.Hold > 0 && (r.Hold > most || p.Algorithm != ratelimit.GCRA || r.ReadOnly) {
		return fmt.Errorf("%w: hold %v: at most %v (the window or the capacity's refill time), and only for a gcra request that counts", ratelimit.ErrInvalidRequest, r.Hold, most)
	}
	if !r.Weight.Valid() {
		return fmt.Errorf("%w: invalid weight %d/%d", ratelimit.ErrInvalidRequest, r.Weight.Num, r.Weight.Den)
	}
	return nil
}

// Decision is a store's decision with what the layers above it need.
type Decision struct {
	ratelimit.Decision
	// State is the algorithm state after the decision, in the deciding
	// store's clock, for a fallback to continue from.
	State State
	// ResendID is set on a refusal by a store that takes a request with
	// the id of one it admitted moments before for a resend of it (and
	// admits it without counting it again): the id of the key's last
	// admission, which it would admit so until ResendUntil (µs since the
	// epoch, the store's clock). A cache of this refusal must not answer
	// a request with that id before then. Empty: no such admission. A
	// store may keep ids in a short form (redisstore keeps those of 11
	// bytes or more as an 11-byte hash): the id is in that form.
	ResendID    string
	ResendUntil int64
	// Weight is the weight a resilient limiter's store decision charged
	// the request at (the zero value: 1/1); a refund of the admission
	// gives back at this weight, whatever the weight is when it is made.
	Weight Weight
}

// Decider decides requests with their weights and holds, and returns the
// states: a Store's extension (redisstore) and a resilient.Limiter's (the
// lease layer draws through it). DecideWire returns one decision and one
// error per request, as ratelimit.BatchLimiter's DecideBatch does.
type Decider interface {
	DecideWire(ctx context.Context, reqs []Request) ([]Decision, []error)
}

// Plain returns the decisions without what the layers add.
func Plain(ds []Decision) []ratelimit.Decision {
	out := make([]ratelimit.Decision, len(ds))
	for i := range ds {
		out[i] = ds[i].Decision
	}
	return out
}

// ValidateKey reports whether key is usable as a client identity, as
// ratelimit.Request.Validate checks its Key: 1 to ratelimit.MaxKeyBytes
// bytes, no ASCII control characters. The error wraps
// ratelimit.ErrInvalidRequest.
func ValidateKey(key string) error {
	if err := keycheck.Check(key, ratelimit.MaxKeyBytes); err != nil {
		return fmt.Errorf("%w: %v", ratelimit.ErrInvalidRequest, err)
	}
	return nil
}
