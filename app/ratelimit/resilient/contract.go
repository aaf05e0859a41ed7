package resilient

import (
	"context"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

func init() { contract.Register(func(l *Limiter) any { return ext{l} }) }

// ext is a Limiter's extension (contract.Extension): what the lease layer
// needs of it beyond deciding.
type ext struct{ l *Limiter }

var (
	_ contract.Refunder = ext{}
	_ contract.Leasable = ext{}
	_ contract.Decider  = ext{}
)

func (e ext) DecideWire(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	return e.l.decideWire(ctx, reqs)
}

func (e ext) Refund(ctx context.Context, req contract.Request, d contract.Decision) (int64, error) {
	return e.l.refundStore(ctx, req, d)
}

func (e ext) InStore() bool { return e.l.inStore() }

func (e ext) OnForget(f func(ratelimit.Policy, store.Identity)) { e.l.setOnForget(f) }
