package memstore

import (
	"context"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

func init() { contract.Register(func(s *Store) any { return ext{s} }) }

// ext is a Store's extension (contract.Extension): decisions with weights
// and states, and replays, the same as the Redis store's, so that a Store
// is the Redis store's twin in the module's tests.
type ext struct{ s *Store }

var _ contract.Decider = ext{}

// DecideWire decides each request as Decide does, with its weight, and
// returns the states.
func (e ext) DecideWire(_ context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	ds, errs := make([]contract.Decision, len(reqs)), make([]error, len(reqs))
	for i, r := range reqs {
		ds[i], errs[i] = e.s.decide(r)
	}
	return ds, errs
}

// Replay folds journaled grants into the state (Store.replay).
func (e ext) Replay(ctx context.Context, batches []store.ReplayBatch) ([]store.ReplayResult, []error) {
	return e.s.replay(ctx, batches)
}
