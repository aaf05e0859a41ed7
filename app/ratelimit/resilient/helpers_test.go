package resilient_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// longPolicy has a window long enough that nothing leaves it, and a limit
// high enough that nothing is refused, during a test.
func longPolicy(alg ratelimit.Algorithm) ratelimit.Policy {
	return ratelimit.Policy{Name: "long-" + strings.ReplaceAll(string(alg), "_", "-"), Algorithm: alg, Limit: 1000, Window: time.Hour}
}

func recoveryConfig(name string) resilient.Config {
	return resilient.Config{
		Instance: name, Timeout: fleetTimeout, ProbeInterval: 200 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, HeartbeatTTL: 500 * time.Millisecond,
		LeaseGrace: 10 * time.Second, ExpectedInstances: instances,
	}
}

// newStore returns a store configured as the service ships it: decisions
// on a client with the limiter's timeout, replays on one of their own.
func newStore(t testing.TB, addr string) *redisstore.Store {
	s, closeAll, err := shippedStore(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAll)
	return s
}

func shippedStore(addr string) (*redisstore.Store, func(), error) {
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{addr}, Timeout: fleetTimeout, PoolSize: 8})
	if err != nil {
		return nil, nil, err
	}
	rc, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{addr}, Timeout: 2 * time.Second, PoolSize: 2})
	if err != nil {
		return nil, nil, err
	}
	return redisstore.New(c, redisstore.Config{ReplayClient: rc}), func() { _ = c.Close(); _ = rc.Close() }, nil
}

func waitFor(t testing.TB, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func allIn(ls []*resilient.Limiter, s resilient.BreakerState) func() bool {
	return func() bool {
		for _, l := range ls {
			// Closed: deciding in Redis with its journal empty, and no
			// longer holding back the share of another instance it last
			// heard was recovering.
			if st := l.Status(); l.Breaker() != s || (s == resilient.BreakerClosed && (st.Journal.Pending > 0 || st.Recovering > 0)) {
				return false
			}
		}
		return true
	}
}

// startInstances starts the fleet's four limiters, each with its own
// client, and waits until their heartbeats see each other.
func startInstances(t *testing.T, addr string) []*resilient.Limiter {
	t.Helper()
	return startInstancesVia(t, func(int) string { return addr })
}

// startInstancesVia is startInstances with instance i reaching Redis at
// addr(i) (a proxy, say).
func startInstancesVia(t *testing.T, addr func(i int) string) []*resilient.Limiter {
	t.Helper()
	var ls []*resilient.Limiter
	for i := range instances {
		l, err := resilient.New(newStore(t, addr(i)), recoveryConfig(fmt.Sprint("app", i+1)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		ls = append(ls, l)
	}
	waitFor(t, "heartbeats", 5*time.Second, func() bool { return ls[0].Status().Live == instances })
	return ls
}

// grantThroughOutage has each instance grant 5 requests per algorithm in
// Redis (round robin, as behind nginx, so every snapshot is recent), kills
// Redis, and has each grant 10 more locally. It returns the grants.
func grantThroughOutage(t *testing.T, srv *redistest.Server, ls []*resilient.Limiter) grantLog {
	t.Helper()
	grants := grantLog{}
	for j := range 5 {
		for i, l := range ls {
			for _, alg := range contract.Algorithms {
				grants.decide(t, l, alg, "client", fmt.Sprintf("redis-%d-%d", i, j), ratelimit.ModeRedis)
			}
		}
	}
	srv.Kill()
	waitFor(t, "every breaker open", 5*time.Second, allIn(ls, resilient.BreakerOpen))
	for i, l := range ls {
		for _, alg := range contract.Algorithms {
			for j := range 10 {
				grants.decide(t, l, alg, "client", fmt.Sprintf("local-%d-%d", i, j), ratelimit.ModeLocal)
			}
		}
	}
	return grants
}

// grantLog records granted requests (id and store time) per algorithm.
type grantLog map[ratelimit.Algorithm][]store.Grant

func (g grantLog) decide(t *testing.T, l *resilient.Limiter, alg ratelimit.Algorithm, key, id string, mode ratelimit.Mode) {
	t.Helper()
	d, err := decideWire(context.Background(), l, ratelimit.Request{Policy: longPolicy(alg), Key: key, ID: id})
	if err != nil || !d.Allowed || d.Mode != mode {
		t.Fatalf("%s %s: %+v %v, want allowed in mode %s", alg, id, d, err, mode)
	}
	g[alg] = append(g[alg], store.Grant{At: d.State.Now, Cost: 1, ID: id})
}

// checkExactUsage compares what Redis holds with the grants.
func checkExactUsage(t *testing.T, srv *redistest.Server, probe *resilient.Limiter, key string, grants grantLog, othersLocal int64) {
	t.Helper()
	ctx := context.Background()
	rs := redisstore.New(srv.Client(), redisstore.Config{})
	for _, alg := range contract.Algorithms {
		p := longPolicy(alg)
		g := grants[alg]
		switch alg {
		case ratelimit.SlidingWindowLog:
			members, err := srv.Client().ZRange(ctx, rs.Key(p, key), 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, x := range g {
				want = append(want, x.ID)
			}
			slices.Sort(members)
			slices.Sort(want)
			if !slices.Equal(members, want) {
				t.Errorf("sliding window log holds %d members %v,\nwant the %d granted ids %v", len(members), members, len(want), want)
			}
		case ratelimit.SlidingWindowCounter:
			h, err := srv.Client().HMGet(ctx, rs.Key(p, key), "c", "p").Result()
			if err != nil {
				t.Fatal(err)
			}
			var sum int64
			for _, v := range h {
				if s, ok := v.(string); ok {
					n, _ := strconv.ParseInt(s, 10, 64)
					sum += n
				}
			}
			if sum != int64(len(g)) {
				t.Errorf("sliding window counter holds %d, want the %d grants", sum, len(g))
			}
		default:
			// One more decision reads the state; an ideal limiter fed the
			// same grants at their times says what it should be.
			d, err := decideWire(ctx, probe, ratelimit.Request{Policy: p, Key: key, ID: "probe-" + string(alg)})
			if err != nil || d.Mode != ratelimit.ModeRedis {
				t.Fatalf("%s probe: %+v %v", alg, d, err)
			}
			want := idealAt(p, key, g, d.State.Now)
			// Never above the ideal (usage erased); at most the other
			// instances' local grants below it (charged without refill).
			if d.Remaining > want.Remaining || d.Remaining < want.Remaining-othersLocal-1 {
				t.Errorf("%s: %d remaining after replay, ideal %d (allowed down to %d)", alg, d.Remaining, want.Remaining, want.Remaining-othersLocal-1)
			}
			t.Logf("%s: %d remaining after replay, ideal %d", alg, d.Remaining, want.Remaining)
		}
	}
}

// lostWrites counts the keys s found to have lost acknowledged writes.
func lostWrites(s *redisstore.Store) uint64 {
	return contract.Extension(s).(interface{ LostWrites() uint64 }).LostWrites()
}

// fleetKey is the Redis key of s's fleet heartbeats.
func fleetKey(s *redisstore.Store) string {
	return contract.Extension(s).(interface{ FleetKey() string }).FleetKey()
}

// decideWire decides req as l.Decide does, through l's extension
// (contract.Decider), which returns the store's state with the decision.
func decideWire(ctx context.Context, l *resilient.Limiter, req ratelimit.Request) (contract.Decision, error) {
	ds, errs := contract.Extension(l).(contract.Decider).DecideWire(ctx, []contract.Request{{Request: req}})
	return ds[0], errs[0]
}

// startPair starts two instances expecting each other, app1 reaching Redis
// at addrs[0] and app2 at addrs[1], with cfg applied to recoveryConfig,
// and waits until each sees both live.
func startPair(t *testing.T, addrs [2]string, cfg func(*resilient.Config)) []*resilient.Limiter {
	t.Helper()
	var ls []*resilient.Limiter
	for i, addr := range addrs {
		c := recoveryConfig(fmt.Sprint("app", i+1))
		c.ExpectedInstances = 2
		cfg(&c)
		l, err := resilient.New(newStore(t, addr), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		ls = append(ls, l)
	}
	waitFor(t, "heartbeats", 5*time.Second, func() bool { return ls[0].Status().Live == 2 && ls[1].Status().Live == 2 })
	return ls
}

// idealAt is the decision of one limiter fed grants (of key under p) in
// time order, for one more unit at now (store µs).
func idealAt(p ratelimit.Policy, key string, grants []store.Grant, now int64) ratelimit.Decision {
	var at int64
	ideal := memstore.New(memstore.Config{Clock: func() time.Time { return time.UnixMicro(at) }})
	sorted := slices.Clone(grants)
	algorithm.SortGrants(sorted)
	for _, g := range sorted {
		at = g.At
		_, _ = ideal.Decide(context.Background(), ratelimit.Request{Policy: p, Key: key})
	}
	at = now
	d, _ := ideal.Decide(context.Background(), ratelimit.Request{Policy: p, Key: key})
	return d
}
