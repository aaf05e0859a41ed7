// Package store is the contract between the resilient limiter and a shared
// store (redisstore is one): the Store interface every store implements,
// the optional interfaces a store implements to take part in more of the
// recovery, and the values they exchange (grants to replay, floors to
// raise keys to, the fleet a heartbeat sees).
//
// A user of the rate limiter does not need this package: ratelimit holds
// the policies, requests and decisions, and resilient.New takes any
// Store. A new backend implements Store, and whichever optional interfaces
// it can; resilient finds them by type assertion.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// Store is the shared store a resilient.Limiter wraps. *redisstore.Store
// satisfies it, and every optional interface below.
type Store interface {
	ratelimit.Limiter
	// Ping checks that the store answers.
	Ping(ctx context.Context) error
	// Heartbeat records the instance as live and returns how many
	// instances are live and how many are suspect (missing for less than
	// grace), the store's data generation and its clock. With an error, a
	// Fleet whose Live is above 0 still carries current counts (the
	// fleet's part answered, another failed).
	Heartbeat(ctx context.Context, instance string, ttl, grace time.Duration) (Fleet, error)
	// Generation returns the store's data generation, which changes when
	// the store loses its data.
	Generation(ctx context.Context) (string, error)
	// Leave removes the instance's heartbeat.
	Leave(ctx context.Context, instance string, ttl, grace time.Duration) error
	// Replay folds journaled grants into the store, each batch at most
	// once (see ReplayBatch).
	Replay(ctx context.Context, batches []ReplayBatch) ([]ReplayResult, []error)
}

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
	HeartbeatStage(ctx context.Context, instance string, ttl, grace time.Duration, stage string) (Fleet, error)
}

// Lossy is a Store that can say what a change of its data generation from
// old to new lost of each key: all of it (a wipe; on a Cluster, only the
// keys of the masters that lost theirs) or its recent writes. Without it,
// a resilient.Limiter takes every key as wiped.
type Lossy interface {
	Loss(old, new string) func(ratelimit.Policy, Identity) Loss
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
	ReadResets(ctx context.Context, after string, apply func(p ratelimit.Policy, id Identity, at int64)) (cursor string, read int64, err error)
}

// ErrFenced is a replay batch's error from a store that keeps resets: its
// key was reset after the batch's ResetsRead. Read the reset log again,
// apply it to the journal, and send what is left.
var ErrFenced = errors.New("store: the key was reset after the resets the replay knew of")
