package redisstore

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

//go:embed lua/refund.lua
var refundLua string

// algorithmArg names an algorithm in the repair scripts' arguments.
var algorithmArg = map[ratelimit.Algorithm]string{
	ratelimit.TokenBucket: "tb", ratelimit.GCRA: "gcra",
	ratelimit.SlidingWindowCounter: "swc", ratelimit.SlidingWindowLog: "swl",
}

// Refund undoes what Redis counted for req, admitted by decision d, and
// returns the units given back (less than the cost when the state has
// refilled, aged or expired since). It is for a request Redis admitted
// after its caller had stopped waiting and answered it otherwise (the
// resilient limiter's late replies): send it once, never again, for a
// refund that timed out may have been applied. Nobody waits on a refund:
// ctx's deadline bounds it, when it has one, instead of the store's
// timeout, so that behind a slow Redis it is applied and known to be (give
// a deadline the client's read timeout allows: ClientConfig.LateReplies).
func (l *Store) refund(ctx context.Context, req contract.Request, d contract.Decision) (int64, error) {
	if err := req.Validate(); err != nil {
		return 0, err
	}
	p := req.Policy
	var now int64
	if l.now != nil {
		now = l.now().UnixMicro()
	}
	callCtx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		callCtx, cancel = l.callContext(ctx)
	}
	defer cancel()
	n, err := fcall(callCtx, l.client, fnRefund, []string{l.Key(p, req.Key)}, now, algorithmArg[p.Algorithm],
		p.Limit, p.Window.Microseconds(), p.Capacity(), req.Units(), scriptID(req), req.Weight.Num, req.Weight.Den, d.State.Now).Int64()
	if err != nil {
		return 0, classify(ctx, err)
	}
	if n < 0 {
		return 0, fmt.Errorf("%w: refund reply %d", ratelimit.ErrBadReply, n)
	}
	return n, nil
}
