package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

//go:embed lua/fleet.lua
var fleetLua string

// FleetKey is the sorted set of instance heartbeats. It has a hash tag of its
// own, so in a Cluster it lives on one slot.
func (l *Store) fleetKey() string { return "{" + l.prefix + ":fleet}:instances" }

// Ping checks that Redis answers, within ctx's deadline, or the limiter's
// timeout when ctx has none. When it does, the function library is loaded
// too: a Redis that was restarted without persistence has none, and
// without this every decision after the outage would pay FCALL, "Function
// not found", FUNCTION LOAD and FCALL again, a burst of latency right when
// the fleet comes back (TestPingLoadsScripts, TestScriptsReloadAfterFlush).
// That is two round trips: a caller that probes a slow Redis (a breaker's
// probe) gives them a deadline of its own.
func (l *Store) Ping(ctx context.Context) error {
	callCtx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		callCtx, cancel = l.callContext(ctx)
	}
	defer cancel()
	_, err := lingering(l, callCtx, func(ctx context.Context) (struct{}, error) {
		if c, ok := l.client.(redis.Cmdable); ok {
			return struct{}{}, c.Ping(ctx).Err()
		}
		return struct{}{}, l.client.Eval(ctx, "return 1", nil).Err()
	})
	if err != nil {
		return classify(ctx, err)
	}
	if err := loadLibrary(callCtx, l.client); err != nil {
		return classify(ctx, err)
	}
	return nil
}

// Warm opens up to n connections of a single-node client now (at most
// PoolSize-2, so the heartbeat and the first decisions always find one), so
// the first decisions after a start do not each pay a dial: the client keeps
// no idle connections warm on its own (see ClientConfig.options). A Cluster
// client, whose pools are per node, is left alone. Before that it loads
// the function library (on every master of a Cluster), so that the first
// decisions on a Redis that never had it do not each meet "Function not
// found" and load it. Best effort.
func (l *Store) warm(ctx context.Context, n int) {
	// A dial takes longer than a call's timeout on a loaded machine.
	callCtx, cancel := context.WithTimeout(ctx, max(l.timeout, 500*time.Millisecond))
	defer cancel()
	_ = loadLibrary(callCtx, l.client)
	c, ok := l.client.(*redis.Client)
	if !ok {
		return
	}
	// Held at once, then all handed back to the pool (holding a pool of 4
	// whole, a Warm of 8 waited out the pool timeout, and the heartbeats
	// with it).
	n = min(n, c.Options().PoolSize-2)
	conns := make([]*redis.Conn, 0, max(n, 0))
	for range n {
		cn := c.Conn()
		conns = append(conns, cn)
		if cn.Ping(callCtx).Err() != nil {
			break
		}
	}
	for _, cn := range conns {
		_ = cn.Close()
	}
}

// Heartbeat records instance as live and returns how many instances are live
// (heartbeat within ttl, this one included), how many are suspect (missing
// for less than grace: possibly cut off and granting locally), Redis' data
// generation (see Generation) and Redis' clock. If the fleet's part
// answered and a Cluster master's generation did not, the counts come back
// with the error.
func (l *Store) Heartbeat(ctx context.Context, instance string, ttl, grace time.Duration) (store.Fleet, error) {
	return l.heartbeatStage(ctx, instance, ttl, grace, "")
}

// HeartbeatStage is Heartbeat, writing the instance's recovery stage beside
// its heartbeat (stage "": none); the reply's Stages are every live
// instance's. The resilient limiter's recovery waits on them: an instance
// decides in Redis again only once every live one has replayed what it
// granted locally.
func (l *Store) heartbeatStage(ctx context.Context, instance string, ttl, grace time.Duration, stage string) (store.Fleet, error) {
	f, err := l.fleet(ctx, instance, "beat", ttl, grace, stage)
	if err != nil {
		return f, err
	}
	return f, l.shardGeneration(ctx, &f.Generation)
}

// shardGeneration replaces *gen with the per-range generations on a Cluster
// (shards.go).
func (l *Store) shardGeneration(ctx context.Context, gen *string) error {
	callCtx, cancel := l.callContext(ctx)
	defer cancel()
	g, cluster, err := l.clusterGeneration(callCtx)
	if err != nil {
		return err
	}
	if cluster {
		*gen = g
	}
	return nil
}

// Generation returns Redis' data generation: a random string stored once
// (without expiry) under the fleet's tag. It changes when Redis loses its
// data (restarted without its AOF, flushed), which tells a recovering
// instance that Redis forgot what was granted before the outage. On a
// Cluster it is one generation per slot range, so that a master that loses
// its data alone is noticed too (shards.go).
func (l *Store) Generation(ctx context.Context) (string, error) {
	f, err := l.fleet(ctx, "-", "peek", time.Second, time.Second, "")
	if err != nil {
		return "", err
	}
	err = l.shardGeneration(ctx, &f.Generation)
	return f.Generation, err
}

// generationKey holds the data generation.
func (l *Store) generationKey() string { return "{" + l.prefix + ":fleet}:generation" }

// writesKey holds the write counter that tells lost writes (lost.go).
func (l *Store) writesKey() string { return "{" + l.prefix + ":fleet}:writes" }

// Leave removes instance's heartbeat (on a clean shutdown: a stopped
// instance grants nothing, so nobody needs to hold its share).
func (l *Store) Leave(ctx context.Context, instance string, ttl, grace time.Duration) error {
	_, err := l.fleet(ctx, instance, "leave", ttl, grace, "")
	return err
}

// Suspend marks instance as deciding locally (its breaker opened): the
// others count it as suspect at once and hold its share back, instead of
// after its heartbeat lapses. On a Cluster with one master down, the fleet
// key's master often still answers while the instances go local one after
// the other.
func (l *Store) suspend(ctx context.Context, instance string, ttl, grace time.Duration) error {
	_, err := l.fleet(ctx, instance, "suspend", ttl, grace, "")
	return err
}

// cutoffKey holds the fleet's charge cutoff (Cutoff).
func (l *Store) cutoffKey() string { return "{" + l.prefix + ":fleet}:cutoff" }

// cutoffTTL is how long the charge cutoff is kept: far longer than the
// replays of one recovery take; the next outage's replays replace it.
const cutoffTTL = 10 * time.Minute

// cutoff returns the fleet's charge cutoff, setting it to Redis' clock when
// there is none since staleBefore (store µs), and Redis' clock (see
// contract.Cutoff).
func (l *Store) cutoff(ctx context.Context, staleBefore int64) (cutoff, now int64, err error) {
	callCtx, cancel := l.callContext(ctx)
	defer cancel()
	keys := []string{l.fleetKey(), l.generationKey(), l.writesKey(), l.syncKey(), l.cutoffKey()}
	args := []any{"-", "cutoff", cutoffTTL.Milliseconds(), 0, randomHex(), 0, "", staleBefore}
	res, err := lingering(l, callCtx, func(ctx context.Context) ([]any, error) {
		return fcall(ctx, l.client, fnFleet, keys, args...).Slice()
	})
	if err != nil {
		return 0, 0, classify(ctx, err)
	}
	if len(res) != 7 {
		return 0, 0, fmt.Errorf("%w: cutoff reply of %d elements", ratelimit.ErrBadReply, len(res))
	}
	now, ok1 := res[2].(int64)
	cutoff, ok2 := res[6].(int64)
	if !ok1 || !ok2 || now <= 0 || cutoff <= 0 || cutoff > now {
		return 0, 0, fmt.Errorf("%w: cutoff reply %v", ratelimit.ErrBadReply, res)
	}
	return cutoff, now, nil
}

// syncKey holds the instances' recovery stages (HeartbeatStage).
func (l *Store) syncKey() string { return "{" + l.prefix + ":fleet}:sync" }

func (l *Store) fleet(ctx context.Context, instance, op string, ttl, grace time.Duration, stage string) (store.Fleet, error) {
	if err := contract.ValidateKey(instance); err != nil {
		return store.Fleet{}, err
	}
	callCtx, cancel := l.callContext(ctx)
	defer cancel()
	floors := l.seen.floors()
	sent := time.Now()
	keys := []string{l.fleetKey(), l.generationKey(), l.writesKey(), l.syncKey()}
	args := []any{instance, op, ttl.Milliseconds(), grace.Milliseconds(), randomHex(), l.beatDeadline(callCtx, op), stage}
	res, err := lingering(l, callCtx, func(ctx context.Context) ([]any, error) {
		return fcall(ctx, l.client, fnFleet, keys, args...).Slice()
	})
	if err != nil {
		return store.Fleet{}, classify(ctx, err)
	}
	recv := time.Now()
	if len(res) != 6 {
		return store.Fleet{}, fmt.Errorf("%w: fleet reply of %d elements", ratelimit.ErrBadReply, len(res))
	}
	rawStages, ok6 := res[5].([]any)
	stages := make([]string, len(rawStages))
	for i, v := range rawStages {
		var ok bool
		if stages[i], ok = v.(string); !ok {
			ok6 = false
		}
	}
	live, ok1 := res[0].(int64)
	suspect, ok2 := res[1].(int64)
	now, ok3 := res[2].(int64)
	gen, ok4 := res[3].(string)
	writes, ok5 := res[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || live < 0 || suspect < 0 || now <= 0 {
		return store.Fleet{}, fmt.Errorf("%w: fleet reply %v", ratelimit.ErrBadReply, res)
	}
	// Redis' clock against this host's, the reply taken as the middle of
	// the round trip.
	l.beatOffset.Store(now - (sent.UnixMicro() + recv.Sub(sent).Microseconds()/2))
	l.beatOffsetKnown.Store(true)
	if gen, err = l.checkCounter(callCtx, l.client, floors, "", l.generationKey(), gen, writes); err != nil {
		return store.Fleet{}, err
	}
	return store.Fleet{Live: int(live), Suspect: int(suspect), Generation: gen, Now: now, Stages: stages}, nil
}

// staleBeatMargin is how long after its caller's deadline a heartbeat may
// still be executed and count: more than the error of the clock offset (half
// a round trip), less than the shortest TCP retransmission (200 ms).
const staleBeatMargin = 100 * time.Millisecond

// beatDeadline is the last moment, in Redis' time (ms), at which a heartbeat
// sent now still counts (0: no limit; any other operation, or before Redis'
// clock is known). A beat executed later was given up on by its caller, which
// counted it as failed, and is not a beat. Where that happens: a partition
// that drops packets (iptables, a cut link) and then heals. The timed-out
// calls' data sits in the kernel's retransmission queues (go-redis closes a
// timed-out connection; the orphaned socket keeps retransmitting), and Redis
// runs those beats when the packets get through: counted, they would make
// the instance, still granting locally with its grants not yet replayed,
// live again, and the others would stop holding its share back
// (TestLateBeatIsNotABeat).
func (l *Store) beatDeadline(ctx context.Context, op string) int64 {
	d, ok := ctx.Deadline()
	if op != "beat" || !ok || !l.beatOffsetKnown.Load() {
		return 0
	}
	return (d.Add(staleBeatMargin).UnixMicro() + l.beatOffset.Load()) / 1000
}

func (l *Store) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if l.timeout > 0 {
		return context.WithTimeout(ctx, l.timeout)
	}
	return ctx, func() {}
}
