// The faults the scenarios inject.

package suite

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetlimit/fleetlimit/chaos/stack"
)

// withLatency delays every Redis reply by d ± jitter for the fault
// duration, then removes the delay.
func withLatency(ctx context.Context, e *Env, d, jitter time.Duration) error {
	detail := d.String()
	if jitter > 0 {
		detail += " ± " + jitter.String()
	}
	if err := e.Stack.Latency(ctx, d, jitter); err != nil {
		c, cancel := cleanupCtx(ctx)
		defer cancel()
		_ = e.Stack.Latency(c, 0, 0)
		return err
	}
	e.Event("latency_start", detail)
	if err := sleep(ctx, e.Fault); err != nil {
		c, cancel := cleanupCtx(ctx)
		defer cancel()
		_ = e.Stack.Latency(c, 0, 0)
		return err
	}
	if err := e.Stack.Latency(ctx, 0, 0); err != nil {
		return err
	}
	e.Event("latency_end", detail)
	return nil
}

// clockStep kills Redis, moves app1's wall clock a window ahead a third
// into the fault and back two thirds into it, and restarts Redis with its
// data at the end.
func clockStep(ctx context.Context, e *Env) (err error) {
	if len(e.Info.Apps) == 0 {
		return fmt.Errorf("no app to step the clock of")
	}
	app := e.Info.Apps[0].Name
	start := time.Now()
	if err := e.Stack.KillRedis(ctx); err != nil {
		return err
	}
	e.Event("redis_down", "SIGKILL")
	stepped := false
	defer func() {
		if stepped {
			c, cancel := cleanupCtx(ctx)
			defer cancel()
			_ = e.Stack.SetClock(c, app, 0)
		}
	}()
	if err := sleep(ctx, time.Until(start.Add(e.Fault/3))); err != nil {
		return err
	}
	if err := e.Stack.SetClock(ctx, app, e.Window); err != nil {
		return err
	}
	stepped = true
	e.Event("clock_step", app+" +"+e.Window.String())
	if err := sleep(ctx, time.Until(start.Add(2*e.Fault/3))); err != nil {
		return err
	}
	if err := e.Stack.SetClock(ctx, app, 0); err != nil {
		return err
	}
	stepped = false
	e.Event("clock_step", app+" back")
	return restartRedisAt(ctx, e, start.Add(e.Fault))
}

// lagFor is how long failover-lag cuts replication before it kills the
// master: the writes of that span are lost.
const lagFor = 5 * time.Second

// promoteWithin bounds the wait for a replica to be promoted.
const promoteWithin = 30 * time.Second

func topologyOf(e *Env) (stack.Topology, error) {
	topo, ok := e.Stack.(stack.Topology)
	if !ok {
		return nil, fmt.Errorf("the %s stack cannot run the scale-out topologies", e.Stack.Name())
	}
	return topo, nil
}

// sentinelFailover kills the Sentinel topology's master (after cutting its
// replica off for lag, if not 0), waits for the replica's promotion, and
// restarts the former master, without its data, when the fault duration is
// over.
func sentinelFailover(ctx context.Context, e *Env, lag time.Duration) error {
	topo, err := topologyOf(e)
	if err != nil {
		return err
	}
	start := time.Now()
	master, err := stack.SentinelMaster(ctx, e.Info)
	if err != nil {
		return err
	}
	if lag > 0 {
		if err := topo.CutReplication(ctx, true); err != nil {
			return err
		}
		e.Event("replication_cut", "the replica stops replicating from "+master.Name)
		defer func() {
			c, cancel := cleanupCtx(ctx)
			defer cancel()
			_ = topo.CutReplication(c, false)
		}()
		if err := sleep(ctx, lag); err != nil {
			return err
		}
	}
	if err := topo.KillNode(ctx, master.Name); err != nil {
		return err
	}
	e.Event("redis_down", "master "+master.Name+" SIGKILL")
	next, err := stack.WaitSentinelMaster(ctx, e.Info, master, promoteWithin)
	if err != nil {
		return fmt.Errorf("waiting for a replica's promotion: %w", err)
	}
	e.Event("failover", next.Name+" promoted")
	if err := sleep(ctx, time.Until(start.Add(e.Fault))); err != nil {
		return err
	}
	// Without its data: it comes back as a replica, whose data the resync
	// from the new master replaces anyway. Loading its AOF would take a
	// core from the stack while it is measured.
	if err := topo.StartNode(ctx, master.Name, true); err != nil {
		return err
	}
	e.Event("redis_up", master.Name+" restarted as a fresh replica")
	return nil
}

// fleetKey is where the apps' heartbeats live (redisstore's FleetKey with
// the default prefix).
const fleetKey = "{rl:fleet}:instances"

// clusterFault acts on one Cluster master: with wipe, one that does not
// hold the fleet's heartbeats is killed and restarted at once without its
// data; without, the one that holds them is killed and its replica
// promoted.
func clusterFault(ctx context.Context, e *Env, wipe bool) error {
	topo, err := topologyOf(e)
	if err != nil {
		return err
	}
	start := time.Now()
	pw := topo.RedisPassword()
	shards, err := stack.ClusterShards(ctx, e.Info, pw)
	if err != nil {
		return err
	}
	slot, err := stack.KeySlot(ctx, e.Info, pw, fleetKey)
	if err != nil {
		return err
	}
	var victim *stack.ClusterShard
	for i, sh := range shards {
		if sh.Serves(slot) != wipe {
			victim = &shards[i]
			break
		}
	}
	if victim == nil {
		return fmt.Errorf("no master to act on among %+v", shards)
	}
	if err := topo.KillNode(ctx, victim.Master.Name); err != nil {
		return err
	}
	e.Event("redis_down", "master "+victim.Master.Name+" SIGKILL")
	if wipe {
		if err := topo.StartNode(ctx, victim.Master.Name, true); err != nil {
			return err
		}
		e.Event("redis_up", victim.Master.Name+" restarted without its data")
		return sleep(ctx, time.Until(start.Add(e.Fault)))
	}
	err = waitFor(ctx, promoteWithin, func(ctx context.Context) error {
		now, err := stack.ClusterShards(ctx, e.Info, pw, victim.Master.Name)
		if err != nil {
			return err
		}
		for _, sh := range now {
			if sh.Serves(victim.Slots[0][0]) && sh.Master.Name != victim.Master.Name {
				e.Event("failover", sh.Master.Name+" promoted")
				return nil
			}
		}
		return fmt.Errorf("slot %d has no new master yet", victim.Slots[0][0])
	})
	if err != nil {
		return err
	}
	// The former master stays down for the rest of the run: restarting it
	// makes it rejoin the Cluster, which takes CPU from the stack while it
	// is measured, and its rejoin is not part of what this scenario judges.
	return sleep(ctx, time.Until(start.Add(e.Fault)))
}

// waitFor polls check every 200 ms until it succeeds, for at most d.
func waitFor(ctx context.Context, d time.Duration, check func(context.Context) error) error {
	deadline := time.Now().Add(d)
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		if serr := sleep(ctx, 200*time.Millisecond); serr != nil {
			return serr
		}
	}
}

// killRestart SIGKILLs Redis, waits down, and starts it again.
func killRestart(ctx context.Context, e *Env, down time.Duration, wipe bool) error {
	if err := e.Stack.KillRedis(ctx); err != nil {
		return err
	}
	e.Event("redis_down", "SIGKILL")
	if err := sleep(ctx, down); err != nil {
		return err
	}
	if err := e.Stack.StartRedis(ctx, wipe); err != nil {
		return err
	}
	if wipe {
		e.Event("redis_up", "restarted without its data")
	} else {
		e.Event("redis_up", "restarted with its data")
	}
	return nil
}

// restartRedisAt waits until t, then restarts Redis with its data: the end
// of a fault that began with Redis killed.
func restartRedisAt(ctx context.Context, e *Env, t time.Time) error {
	if err := sleep(ctx, time.Until(t)); err != nil {
		return err
	}
	if err := e.Stack.StartRedis(ctx, false); err != nil {
		return err
	}
	e.Event("redis_up", "restarted with its data")
	return nil
}
