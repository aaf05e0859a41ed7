// Package store is the contract between the resilient limiter and a shared
// store (redisstore is one): the Store interface a store implements, and
// the values it exchanges with resilient (grants to replay, the fleet a
// heartbeat sees).
//
// A user of the rate limiter does not need this package: ratelimit holds
// the policies, requests and decisions, and resilient.New takes any
// Store. A new backend implements Store. The stores of this module also
// take part in more of the recovery (suspending an instance, refunding late
// admissions, raising keys a failover lost, fleet-wide resets) through
// interfaces internal to the module; a store from outside it is decided
// with the whole policy (no share held back for an instance cut off), its
// decisions carry no algorithm state for the fallback to continue from,
// and the lease layer takes no lease from it.
package store

import (
	"context"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// Store is the shared store a resilient.Limiter wraps. *redisstore.Store
// satisfies it.
type Store interface {
	ratelimit.Limiter
	// Ping checks that the store answers, within ctx's deadline.
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
