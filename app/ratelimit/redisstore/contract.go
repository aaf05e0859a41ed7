package redisstore

import (
	"context"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// A Store implements store.Store, and its extension every optional
// interface of the module's store contract, so resilient.New takes it with
// the whole recovery.
var (
	_ store.Store           = (*Store)(nil)
	_ contract.Suspender    = ext{}
	_ contract.Warmer       = ext{}
	_ contract.LateReporter = ext{}
	_ contract.Refunder     = ext{}
	_ contract.Sharded      = ext{}
	_ contract.Stager       = ext{}
	_ contract.Lossy        = ext{}
	_ contract.Raiser       = ext{}
	_ contract.Resetter     = ext{}
	_ contract.Decider      = ext{}
	_ contract.Cutoff       = ext{}
)

func init() { contract.Register(func(s *Store) any { return ext{s} }) }

// ext is a Store's extension (contract.Extension): its part of the
// recovery, which only resilient calls.
type ext struct{ s *Store }

func (e ext) DecideWire(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	return e.s.decideBatch(ctx, reqs)
}

func (e ext) Suspend(ctx context.Context, instance string, ttl, grace time.Duration) error {
	return e.s.suspend(ctx, instance, ttl, grace)
}

func (e ext) Warm(ctx context.Context, n int) { e.s.warm(ctx, n) }

func (e ext) OnLate(window time.Duration, fn func(contract.LateReply)) bool {
	return e.s.onLate(window, fn)
}

func (e ext) Refund(ctx context.Context, req contract.Request, d contract.Decision) (int64, error) {
	return e.s.refund(ctx, req, d)
}

func (e ext) Sharded() bool { return e.s.sharded() }

func (e ext) HeartbeatStage(ctx context.Context, instance string, ttl, grace time.Duration, stage string) (store.Fleet, error) {
	return e.s.heartbeatStage(ctx, instance, ttl, grace, stage)
}

func (e ext) Loss(old, new string) func(ratelimit.Policy, store.Identity) contract.Loss {
	return e.s.loss(old, new)
}

func (e ext) Raise(ctx context.Context, floors []contract.Floor) ([]int64, []error) {
	return e.s.raise(ctx, floors)
}

func (e ext) Reset(ctx context.Context, identity string, policies ...ratelimit.Policy) error {
	return e.s.Reset(ctx, identity, policies...)
}

func (e ext) ReadResets(ctx context.Context, after string, apply func(ratelimit.Policy, store.Identity, int64)) (string, int64, error) {
	return e.s.readResets(ctx, after, apply)
}

// FleetKey is the Redis key of the fleet's heartbeats.
func (e ext) FleetKey() string { return e.s.fleetKey() }

func (e ext) Cutoff(ctx context.Context, staleBefore int64) (cutoff, now int64, err error) {
	return e.s.cutoff(ctx, staleBefore)
}

// LostWrites counts the keys found to have lost acknowledged writes.
func (e ext) LostWrites() uint64 { return e.s.lostWrites() }
