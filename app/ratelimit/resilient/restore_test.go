package resilient_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/redis/go-redis/v9"
)

// TestWipeRestoresUsage: Redis comes back without its data; the instances
// put back the usage their snapshots knew (once: the first restore of a key
// wins), then replay their journals on top.
func TestWipeRestoresUsage(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	ls := startInstances(t, srv.Addr())
	grantThroughOutage(t, srv, ls)
	srv.RestartEmpty(t)
	waitFor(t, "every breaker closed with an empty journal", 10*time.Second, allIn(ls, resilient.BreakerClosed))
	restores := 0
	for _, l := range ls {
		restores += int(l.Status().Restores)
	}
	if restores != instances {
		t.Errorf("%d restores, want one per instance", restores)
	}
	ctx := context.Background()
	for _, alg := range contract.Algorithms {
		p := longPolicy(alg)
		d, err := ls[0].Decide(ctx, ratelimit.Request{Policy: p, Key: "client", ID: "probe-" + string(alg)})
		if err != nil || d.Mode != ratelimit.ModeRedis {
			t.Fatalf("%s: %+v %v", alg, d, err)
		}
		// 20 granted in Redis (the snapshots knew 17 to 20 of them), 40
		// locally, and the probe: without the restore 959 would be left.
		if d.Remaining > 1000-58 || d.Remaining < 1000-61-3 {
			t.Errorf("%s: %d remaining after the wipe, want about %d", alg, d.Remaining, 1000-61)
		}
		t.Logf("%s: %d remaining after the wipe (no wipe: %d)", alg, d.Remaining, 1000-61)
	}
	// redisstore's generation key under its default prefix.
	if n := srv.Client().Exists(ctx, "{rl:fleet}:generation").Val(); n != 1 {
		t.Errorf("generation key missing after recovery")
	}
}

// TestClusterShardWipeIsRestored: on a 3-master Cluster, a master that does
// not hold the fleet's keys loses its data. The per-range generations notice
// it, and the usage the snapshots knew is put back for the keys of that
// master only: keys on the other masters are not charged twice.
func TestClusterShardWipeIsRestored(t *testing.T) {
	cl := redistest.StartCluster(t)
	client := redis.NewClusterClient(cl.ClusterOptions())
	t.Cleanup(func() { _ = client.Close() })
	rs := redisstore.New(client, redisstore.Config{Timeout: time.Second})
	l, err := resilient.New(rs, resilient.Config{Instance: "shard", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	p := ratelimit.Policy{Name: "shard", Algorithm: ratelimit.TokenBucket, Limit: 10, Window: time.Hour}
	var keys []string
	for i := range 60 {
		k := fmt.Sprint("client-", i)
		keys = append(keys, k)
		for range 5 {
			if d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k}); err != nil || !d.Allowed || d.Mode != ratelimit.ModeRedis {
				t.Fatalf("%s: %+v %v", k, d, err)
			}
		}
	}
	fleetMaster := cl.MasterFor(fleetKey(rs))
	var wiped *redistest.Server
	onWiped := 0
	for _, k := range keys {
		if m := cl.MasterFor(rs.Key(p, k)); m != fleetMaster {
			if wiped == nil {
				wiped = m
			}
			if m == wiped {
				onWiped++
			}
		}
	}
	if wiped == nil || onWiped == 0 {
		t.Fatal("no key on a master other than the fleet's")
	}
	time.Sleep(300 * time.Millisecond) // a few heartbeats: the generations are known
	if err := wiped.Client().FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a restore", 5*time.Second, func() bool { return l.Status().Restores >= 1 })
	// Decisions are local until the fleet has put back and replayed.
	waitFor(t, "the breaker closed", 5*time.Second, allIn([]*resilient.Limiter{l}, resilient.BreakerClosed))
	for _, k := range keys {
		d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k})
		if err != nil || d.Mode != ratelimit.ModeRedis {
			t.Fatalf("%s: %+v %v", k, d, err)
		}
		where := "another master"
		if cl.MasterFor(rs.Key(p, k)) == wiped {
			where = "the wiped master"
		}
		if d.Remaining != 4 {
			t.Errorf("%s (on %s): %d left after 6 requests, want 4: the usage before the wipe must count once", k, where, d.Remaining)
		}
	}
}

// TestReplayWaitsForTheLateInstancesRaise: after Redis comes back empty,
// app1 is back first and raises its keys; app2, cut off a while longer,
// raises its keys when it comes back. A raise is a max-merge to a floor:
// after another instance's replay it could undo part of it. So app1
// replays its journal only once app2, live before the outage, has raised.
func TestReplayWaitsForTheLateInstancesRaise(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	cut := redistest.StartProxy(t, srv.Addr())
	var ls []*resilient.Limiter
	for i, addr := range []string{srv.Addr(), cut.Addr()} {
		l, err := resilient.New(newStore(t, addr), func() resilient.Config {
			cfg := recoveryConfig(fmt.Sprint("app", i+1))
			cfg.ExpectedInstances, cfg.RecoveryWait = 2, 20*time.Second
			return cfg
		}())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		ls = append(ls, l)
	}
	waitFor(t, "heartbeats", 5*time.Second, func() bool { return ls[0].Status().Live == 2 && ls[1].Status().Live == 2 })
	p := longPolicy(ratelimit.SlidingWindowLog)
	for _, l := range ls { // snapshots to restore, so both raise
		if d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "seen"}); err != nil || d.Mode != ratelimit.ModeRedis {
			t.Fatalf("%+v %v", d, err)
		}
	}
	srv.Kill()
	waitFor(t, "both breakers open", 5*time.Second, allIn(ls, resilient.BreakerOpen))
	for range 20 {
		if d, err := ls[0].Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"}); err != nil || !d.Allowed {
			t.Fatalf("local grant: %+v %v", d, err)
		}
	}
	cut.Disable()
	srv.RestartEmpty(t)
	waitFor(t, "app1's raise", 10*time.Second, func() bool { return ls[0].Status().Raises >= 1 })
	time.Sleep(time.Second) // app2 still cut off
	if st := ls[0].Status(); st.Journal.Pending == 0 {
		t.Fatalf("app1 replayed its journal before app2, live before the outage, came back and raised (app2: %d raises)", ls[1].Status().Raises)
	}
	cut.Enable()
	waitFor(t, "both breakers closed", 15*time.Second, allIn(ls, resilient.BreakerClosed))
}
