package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

//go:embed lua/fleet.lua
var fleetLua string

var fleetScript = redis.NewScript(fleetLua)

// FleetKey is the sorted set of instance heartbeats. It has a hash tag of its
// own, so in a Cluster it lives on one slot.
func (l *Limiter) FleetKey() string { return "{" + l.prefix + ":fleet}:instances" }

// Ping checks that Redis answers, within the limiter's timeout.
func (l *Limiter) Ping(ctx context.Context) error {
	callCtx, cancel := l.callContext(ctx)
	defer cancel()
	var err error
	if c, ok := l.client.(redis.Cmdable); ok {
		err = c.Ping(callCtx).Err()
	} else {
		err = l.client.Eval(callCtx, "return 1", nil).Err()
	}
	if err != nil {
		return classify(ctx, err)
	}
	return nil
}

// Heartbeat records instance as live and returns how many instances are live
// (heartbeat within ttl, this one included) and how many are suspect
// (missing for less than grace: possibly cut off and granting locally).
func (l *Limiter) Heartbeat(ctx context.Context, instance string, ttl, grace time.Duration) (live, suspect int, err error) {
	return l.fleet(ctx, instance, "beat", ttl, grace)
}

// Leave removes instance's heartbeat (on a clean shutdown: a stopped
// instance grants nothing, so nobody needs to hold its share).
func (l *Limiter) Leave(ctx context.Context, instance string, ttl, grace time.Duration) error {
	_, _, err := l.fleet(ctx, instance, "leave", ttl, grace)
	return err
}

func (l *Limiter) fleet(ctx context.Context, instance, op string, ttl, grace time.Duration) (int, int, error) {
	if err := ratelimit.ValidateKey(instance); err != nil {
		return 0, 0, err
	}
	callCtx, cancel := l.callContext(ctx)
	defer cancel()
	res, err := fleetScript.Run(callCtx, l.client, []string{l.FleetKey()}, instance, op, ttl.Milliseconds(), grace.Milliseconds()).Slice()
	if err != nil {
		return 0, 0, classify(ctx, err)
	}
	if len(res) != 3 {
		return 0, 0, fmt.Errorf("%w: fleet reply of %d elements", ratelimit.ErrBadReply, len(res))
	}
	live, ok1 := res[0].(int64)
	suspect, ok2 := res[1].(int64)
	if !ok1 || !ok2 || live < 0 || suspect < 0 {
		return 0, 0, fmt.Errorf("%w: fleet reply %v", ratelimit.ErrBadReply, res)
	}
	return int(live), int(suspect), nil
}

func (l *Limiter) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if l.timeout > 0 {
		return context.WithTimeout(ctx, l.timeout)
	}
	return ctx, func() {}
}
