package resilient

import (
	"context"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

func init() {
	contract.Register(func(l ratelimit.Limiter) (any, bool) {
		r, ok := l.(*Limiter)
		if !ok {
			return nil, false
		}
		return ext{r}, true
	})
}

// ext is a Limiter's extension (contract.Extension): what the lease layer
// needs of it beyond deciding.
type ext struct{ l *Limiter }

var (
	_ contract.Refunder = ext{}
	_ contract.Leasable = ext{}
)

func (e ext) Refund(ctx context.Context, req ratelimit.Request, d ratelimit.Decision) (int64, error) {
	return e.l.refundStore(ctx, req, d)
}

func (e ext) InStore() bool { return e.l.inStore() }

func (e ext) OnForget(f func(ratelimit.Policy, store.Identity)) { e.l.setOnForget(f) }
