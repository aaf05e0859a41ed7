package resilient_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// TestResetAcrossTheFleet: four instances share one Redis. A spent key is
// refused by every instance, from its cache after the first refusal. A reset
// on one instance drops the key's state in Redis under the policies named,
// and every instance forgets its cached refusal at its next heartbeat, after
// which each admits the key. The key's state under another policy, and other
// identities' state, are untouched. With Redis gone, a reset holds on the
// instance that made it and says it is partial.
func TestResetAcrossTheFleet(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	ls := startInstances(t, srv.Addr())
	ctx := context.Background()
	logPol := ratelimit.Policy{Name: "reset-log", Algorithm: ratelimit.SlidingWindowLog, Limit: instances, Window: time.Hour}
	gcraPol := ratelimit.Policy{Name: "reset-gcra", Algorithm: ratelimit.GCRA, Limit: instances, Window: time.Hour}
	keep := ratelimit.Policy{Name: "reset-keep", Algorithm: ratelimit.SlidingWindowCounter, Limit: 100, Window: time.Hour}
	decide := func(l *resilient.Limiter, p ratelimit.Policy, key string) ratelimit.Decision {
		t.Helper()
		d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: key})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, p := range []ratelimit.Policy{logPol, gcraPol} {
		for range instances {
			if d := decide(ls[0], p, "k:spent"); !d.Allowed {
				t.Fatalf("%s: refused within the quota: %+v", p.Name, d)
			}
		}
		decide(ls[0], p, "k:other")
		for i, l := range ls {
			cached := l.Status().CachedRefusals
			for range 2 {
				if d := decide(l, p, "k:spent"); d.Allowed || d.Mode != ratelimit.ModeRedis {
					t.Fatalf("instance %d, %s: %+v, want refused", i, p.Name, d)
				}
			}
			if l.Status().CachedRefusals != cached+1 {
				t.Fatalf("instance %d, %s: the second refusal was not answered from the cache", i, p.Name)
			}
		}
	}
	decide(ls[0], keep, "k:spent")
	applied := make([]uint64, len(ls))
	for i, l := range ls {
		applied[i] = l.Status().ResetsApplied
	}

	if err := ls[1].Reset(ctx, "k:spent", logPol, gcraPol); err != nil {
		t.Fatalf("reset: %v, want fleet-wide", err)
	}
	c := srv.Client()
	defer c.Close()
	rs := newStore(t, srv.Addr()) // for its key names
	for _, k := range []struct {
		p    ratelimit.Policy
		key  string
		want int64
	}{{logPol, "k:spent", 0}, {gcraPol, "k:spent", 0}, {keep, "k:spent", 1}, {logPol, "k:other", 1}, {gcraPol, "k:other", 1}} {
		if n, err := c.Exists(ctx, rs.Key(k.p, k.key)).Result(); err != nil || n != k.want {
			t.Errorf("%s of %s in Redis: %d %v, want %d", k.p.Name, k.key, n, err, k.want)
		}
	}
	// Every instance reads the reset at its next heartbeat.
	waitFor(t, "every instance to apply the reset", 5*time.Second, func() bool {
		for i, l := range ls {
			if l.Status().ResetsApplied < applied[i]+2 {
				return false
			}
		}
		return true
	})
	for i, l := range ls {
		for _, p := range []ratelimit.Policy{logPol, gcraPol} {
			if d := decide(l, p, "k:spent"); !d.Allowed || d.Mode != ratelimit.ModeRedis {
				t.Errorf("instance %d, %s after the reset: %+v, want admitted by Redis", i, p.Name, d)
			}
		}
	}

	srv.Kill()
	waitFor(t, "the breaker to open", 5*time.Second, func() bool {
		_, _ = ls[2].Decide(ctx, ratelimit.Request{Policy: logPol, Key: "k:spent"})
		return ls[2].Breaker() == resilient.BreakerOpen
	})
	for ls[2].Status().LocalDecisions < 1000 { // spend its local share
		if !decide(ls[2], logPol, "k:spent").Allowed {
			break
		}
	}
	if d := decide(ls[2], logPol, "k:spent"); d.Allowed || d.Mode != ratelimit.ModeLocal {
		t.Fatalf("local share not spent: %+v", d)
	}
	if err := ls[2].Reset(ctx, "k:spent", logPol); !errors.Is(err, resilient.ErrResetPartial) {
		t.Fatalf("reset with Redis gone: %v, want partial", err)
	}
	if d := decide(ls[2], logPol, "k:spent"); !d.Allowed || d.Mode != ratelimit.ModeLocal {
		t.Errorf("after a partial reset: %+v, want admitted from a fresh local share", d)
	}
}

// TestResetForgetsTheCachedRefusal: with a store that cannot reset for the
// fleet, a reset still clears this instance's cached refusal (the next
// request goes to the store) and says it is partial; a bad request resets
// nothing.
func TestResetForgetsTheCachedRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		f.live.Store(1)
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 2, Window: time.Hour}
		admit(t, l, p, "k", 3, ratelimit.ModeRedis)
		calls := len(f.DecideCalls())
		admit(t, l, p, "k", 1, ratelimit.ModeRedis)
		if len(f.DecideCalls()) != calls {
			t.Fatal("the refusal was not cached")
		}
		for _, bad := range []struct {
			key string
			ps  []ratelimit.Policy
		}{{"", []ratelimit.Policy{p}}, {"k", nil}, {"k", []ratelimit.Policy{{Name: "bad"}}}} {
			if err := l.Reset(context.Background(), bad.key, bad.ps...); err == nil || errors.Is(err, resilient.ErrResetPartial) {
				t.Errorf("reset of %q %v: no error", bad.key, bad.ps)
			}
		}
		admit(t, l, p, "k", 1, ratelimit.ModeRedis)
		if len(f.DecideCalls()) != calls {
			t.Fatal("a bad reset cleared the cached refusal")
		}
		if err := l.Reset(context.Background(), "k", p); !errors.Is(err, resilient.ErrResetPartial) {
			t.Fatalf("reset: %v, want partial", err)
		}
		admit(t, l, p, "k", 1, ratelimit.ModeRedis)
		if len(f.DecideCalls()) != calls+1 {
			t.Error("after the reset the request was answered from the cache")
		}
		if got := l.Status().ResetsApplied; got != 1 {
			t.Errorf("resets applied %d, want 1", got)
		}
	})
}

// TestResetHoldsAcrossAHeal: app1, cut off from Redis, grants a key 20
// units locally; the key is reset through app2; app1 grants it 10 more
// before the cut heals. Once app1 is back, Redis holds the 10 units granted
// after the reset, for every algorithm: the 20 from before it never come
// back, and none made after it is lost.
func TestResetHoldsAcrossAHeal(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	proxy := redistest.StartProxy(t, srv.Addr())
	ls := startInstancesVia(t, func(i int) string {
		if i == 0 {
			return proxy.Addr()
		}
		return srv.Addr()
	})
	ctx := context.Background()
	var pols []ratelimit.Policy
	for _, alg := range contract.Algorithms {
		pols = append(pols, ratelimit.Policy{Name: "heal-" + string(alg), Algorithm: alg, Limit: 400, Window: time.Hour})
	}
	grant := func(l *resilient.Limiter, p ratelimit.Policy, n int, mode ratelimit.Mode, tag string) {
		t.Helper()
		for j := range n {
			d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k:reset", ID: fmt.Sprintf("%s-%s-%d", p.Name, tag, j)})
			if err != nil || !d.Allowed || d.Mode != mode {
				t.Fatalf("%s %s %d: %+v %v, want admitted in mode %s", p.Name, tag, j, d, err, mode)
			}
		}
	}
	for _, p := range pols {
		grant(ls[0], p, 4, ratelimit.ModeRedis, "before")
	}
	proxy.Disable()
	waitFor(t, "app1's breaker to open", 5*time.Second, func() bool {
		_, _ = ls[0].Decide(ctx, ratelimit.Request{Policy: pols[0], Key: "k:probe"})
		return ls[0].Breaker() == resilient.BreakerOpen
	})
	for _, p := range pols {
		grant(ls[0], p, 20, ratelimit.ModeLocal, "pre")
	}
	if err := ls[1].Reset(ctx, "k:reset", pols...); err != nil {
		t.Fatalf("reset through app2: %v", err)
	}
	for _, p := range pols {
		grant(ls[0], p, 10, ratelimit.ModeLocal, "post")
	}
	proxy.Enable()
	waitFor(t, "every breaker closed", 10*time.Second, allIn(ls, resilient.BreakerClosed))
	rs := newStore(t, srv.Addr())
	for _, p := range pols {
		d, err := rs.Decide(ctx, ratelimit.Request{Policy: p, Key: "k:reset", ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		// 10 units since the reset; the refill of the test's seconds at
		// 400 an hour is under a unit.
		if want := p.Limit - 10; d.Remaining < want || d.Remaining > want+1 {
			t.Errorf("%s: Redis has %d left after the heal, want %d (the 10 units granted after the reset)", p.Name, d.Remaining, want)
		}
	}
	st := ls[0].Status().Journal
	if st.Dropped < 20*uint64(len(pols)) || st.Pending != 0 {
		t.Errorf("app1's journal: %+v, want the 20 units a policy from before the reset dropped and nothing pending", st)
	}
}

// TestSecondApplicationKeepsLaterGrants: a reset made on app1 while Redis
// is out for it holds there alone, and is applied once more a Timeout
// later (for a late reply). app1 is back before then and, recovering
// (app2, live before the outage, is gone), grants the key 10 units
// locally: the second application forgets the key's cached refusal only,
// so those grants are replayed, none dropped.
func TestSecondApplicationKeepsLaterGrants(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	proxy := redistest.StartProxy(t, srv.Addr())
	cfg := func(name string) resilient.Config {
		c := recoveryConfig(name)
		c.Timeout, c.ExpectedInstances, c.RecoveryWait = time.Second, 2, 30*time.Second
		return c
	}
	app1, err := resilient.New(newStore(t, proxy.Addr()), cfg("app1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = app1.Close(context.Background()) })
	app2, err := resilient.New(newStore(t, srv.Addr()), cfg("app2"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "heartbeats", 5*time.Second, func() bool { return app1.Status().Live == 2 })
	ctx := context.Background()
	p := ratelimit.Policy{Name: "again", Algorithm: ratelimit.SlidingWindowLog, Limit: 400, Window: time.Hour}
	if d, err := app1.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"}); err != nil || d.Mode != ratelimit.ModeRedis {
		t.Fatalf("%+v %v", d, err)
	}
	proxy.Disable()
	waitFor(t, "app1's breaker to open", 10*time.Second, func() bool {
		_, _ = app1.Decide(ctx, ratelimit.Request{Policy: p, Key: "k:probe"})
		return app1.Breaker() == resilient.BreakerOpen
	})
	_ = app2.Close(ctx)
	if err := app1.Reset(ctx, "k", p); !errors.Is(err, resilient.ErrResetPartial) {
		t.Fatalf("reset with Redis out: %v, want partial", err)
	}
	proxy.Enable()
	waitFor(t, "app1 to recover", 5*time.Second, func() bool { return app1.Breaker() == resilient.BreakerRecovering })
	for j := range 10 {
		d, err := app1.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: fmt.Sprint("after-", j)})
		if err != nil || !d.Allowed || d.Mode != ratelimit.ModeLocal {
			t.Fatalf("grant %d while recovering: %+v %v", j, d, err)
		}
	}
	time.Sleep(1500 * time.Millisecond) // the second application is due and applied
	if st := app1.Status().Journal; st.Dropped != 0 || st.Replayed+st.Pending != st.Granted {
		t.Fatalf("app1's journal after the second application: %+v, want every grant made after the reset pending or replayed, none dropped", st)
	}
}
