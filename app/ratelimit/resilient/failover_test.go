package resilient_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// TestFailoverLagIsRaised: Sentinel promotes a replica that is behind its
// master (replication was cut before the last requests), so Redis silently
// forgets usage it acknowledged. The write counter notices it, and the
// instances raise every key to the usage their last replies showed: each
// key's later admissions are exactly what its quota has left, for every
// algorithm, and the usage the replica did hold is not counted twice.
func TestFailoverLagIsRaised(t *testing.T) {
	s := redistest.StartSentinel(t)
	var ls []*resilient.Limiter
	var stores []*redisstore.Store
	for i := range 2 {
		client, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: s.SentinelAddrs(), MasterName: s.MasterName(), Timeout: time.Second, PoolSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.Close() })
		rs := redisstore.New(client, redisstore.Config{Timeout: time.Second})
		cfg := recoveryConfig(fmt.Sprint("app", i+1))
		cfg.Timeout, cfg.ExpectedInstances = time.Second, 2
		l, err := resilient.New(rs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		ls, stores = append(ls, l), append(stores, rs)
	}
	waitFor(t, "heartbeats", 5*time.Second, func() bool { return ls[0].Status().Live == 2 })
	ctx := context.Background()
	const limit, before, after = 20, 5, 7
	algs := []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.SlidingWindowCounter, ratelimit.SlidingWindowLog}
	policy := func(alg ratelimit.Algorithm) ratelimit.Policy {
		p := longPolicy(alg)
		p.Limit = limit
		return p
	}
	grant := func(n int) {
		t.Helper()
		for _, alg := range algs {
			for i := range n {
				d, err := ls[i%2].Decide(ctx, ratelimit.Request{Policy: policy(alg), Key: "lag"})
				if err != nil || !d.Allowed || d.Mode != ratelimit.ModeRedis {
					t.Fatalf("%s: %+v %v", alg, d, err)
				}
			}
		}
	}
	grant(before)
	s.CutReplication(t) // the replica stops here
	grant(after)
	time.Sleep(300 * time.Millisecond) // heartbeats after the cut: the replica misses them too
	s.Failover(t)

	waitFor(t, "the lost writes to be noticed and raised", 10*time.Second, func() bool {
		return ls[0].Status().Raises >= 1 && ls[1].Status().Raises >= 1
	})
	// The promoted replica missed the last heartbeats too: until both
	// instances beat again, each holds the other's share back as suspect.
	waitFor(t, "both instances live", 5*time.Second, func() bool {
		for _, l := range ls {
			if st := l.Status(); st.Live != 2 || st.Suspect != 0 {
				return false
			}
		}
		return true
	})
	// Decisions are local until both have raised and replayed.
	waitFor(t, "both breakers closed", 5*time.Second, allIn(ls, resilient.BreakerClosed))
	if lostWrites(stores[0])+lostWrites(stores[1]) == 0 {
		t.Error("raised without a lost write counted")
	}
	for _, alg := range algs {
		admitted := 0
		for range limit {
			d, err := ls[0].Decide(ctx, ratelimit.Request{Policy: policy(alg), Key: "lag"})
			if err != nil || d.Mode != ratelimit.ModeRedis {
				t.Fatalf("%s: %+v %v", alg, d, err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if want := limit - before - after; admitted != want {
			t.Errorf("%s: %d admitted after the failover, want %d (the quota left by the %d granted before it)", alg, admitted, want, before+after)
		}
	}
}
