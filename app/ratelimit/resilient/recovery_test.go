package resilient_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// These tests check what Redis holds after an outage and a replay: the
// exact usage the fleet granted, each grant once, whatever fails on the way.

// TestReplayLeavesExactUsage: four instances grant in Redis, then locally
// while Redis is killed, then replay; Redis holds exactly what was granted.
func TestReplayLeavesExactUsage(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	ls := startInstances(t, srv.Addr())
	grants := grantThroughOutage(t, srv, ls)
	srv.Restart(t)
	waitFor(t, "every breaker closed with an empty journal", 10*time.Second, allIn(ls, resilient.BreakerClosed))
	checkExactUsage(t, srv, ls[0], "client", grants, 30)
	for _, l := range ls {
		j := l.Status().Journal
		if j.Granted != 40 || j.Replayed != 40 || j.Duplicates != 0 || j.Pending != 0 {
			t.Errorf("%s journal %+v, want 40 granted and replayed", l.Status().Instance, j)
		}
	}
}

// lossyStore applies replays but, the first time every batch of a call was
// applied, reports failure for every batch: the acknowledgements are lost,
// as when Redis dies right after running the scripts or the instance
// crashes before clearing its journal. (A call that really failed, say one
// that timed out on a loaded machine before its scripts ran, is passed on
// as it is: losing its acknowledgements would lose nothing.)
type lossyStore struct {
	*redisstore.Store
	lost atomic.Bool
}

func (s *lossyStore) Replay(ctx context.Context, b []store.ReplayBatch) ([]store.ReplayResult, []error) {
	res, errs := s.Store.Replay(ctx, b)
	if !s.lost.Load() && !slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
		s.lost.Store(true)
		for i := range errs {
			errs[i] = fmt.Errorf("%w: connection reset after the scripts ran", ratelimit.ErrUnavailable)
		}
	}
	return res, errs
}

// DecideWire decides with weights and states, as the store's extension
// does (the extension's other interfaces are not needed here).
func (s *lossyStore) DecideWire(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	return contract.Extension(s.Store).(contract.Decider).DecideWire(ctx, reqs)
}

// TestInterruptedReplayCountsOnce: a replay whose acknowledgements are lost
// is sent again; the markers make Redis apply it once.
func TestInterruptedReplayCountsOnce(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	rs := &lossyStore{Store: newStore(t, srv.Addr())}
	l, err := resilient.New(rs, recoveryConfig("app1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	waitFor(t, "a heartbeat", 5*time.Second, func() bool { return l.Status().Live == 1 })
	grants := grantLog{}
	srv.Kill()
	waitFor(t, "the breaker open", 5*time.Second, allIn([]*resilient.Limiter{l}, resilient.BreakerOpen))
	for _, alg := range contract.Algorithms {
		for j := range 20 {
			grants.decide(t, l, alg, "client", fmt.Sprintf("local-%d", j), ratelimit.ModeLocal)
		}
	}
	srv.Restart(t)
	waitFor(t, "the breaker closed with an empty journal", 10*time.Second, allIn([]*resilient.Limiter{l}, resilient.BreakerClosed))
	checkExactUsage(t, srv, l, "client", grants, 0)
	j := l.Status().Journal
	if j.Duplicates != 4 || j.DuplicateUnits != 80 || j.Granted != j.DuplicateUnits || j.Replayed != 0 {
		t.Errorf("journal %+v, want the 4 batches (80 units) refused as duplicates on the second send", j)
	}
}

// TestReplayIsNetOfRefill: through an outage more than three times a full
// refill, four instances grant an abusive key (at four times its rate) and a
// polite one (at 40 % of it) from their shares, then replay. Redis must then
// hold no more than an ideal limiter fed every grant in time order (no usage
// erased). The polite key's shares never ran dry: it must hold what the ideal
// holds. The abusive key may hold less, by design: each share counts no
// refill before the others can hold it back (confirmedAt), and charges in
// full what it granted from the level it started with, which the others may
// have taken too. How much less depends on how late the heartbeats and
// replies were, which a loaded machine stretches, so what is asserted is what
// separates a net charge from a gross one: each share owes at most its
// capacity plus what it started with, so the key at most two capacities (a
// reset at most two windows away), where charging the outage's grants in full,
// or twice, would put it more than three windows in debt.
func TestReplayIsNetOfRefill(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
			ls := startInstances(t, srv.Addr())
			p := ratelimit.Policy{Name: "short-" + strings.ReplaceAll(string(alg), "_", "-"), Algorithm: alg, Limit: 100, Window: 2 * time.Second}
			var (
				mu     sync.Mutex
				grants = map[string][]store.Grant{}
				wg     sync.WaitGroup
			)
			ctx, stop := context.WithCancel(context.Background())
			send := func(key string, every time.Duration) {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					d, err := decideWire(ctx, ls[i%len(ls)], ratelimit.Request{Policy: p, Key: key})
					if err == nil && d.Allowed {
						mu.Lock()
						grants[key] = append(grants[key], store.Grant{At: d.State.Now, Cost: 1})
						mu.Unlock()
					}
					time.Sleep(every)
				}
			}
			wg.Add(2)
			go send("abusive", 5*time.Millisecond) // 200/s against 50/s
			go send("polite", 50*time.Millisecond) // 20/s
			time.Sleep(time.Second)
			srv.Kill()
			waitFor(t, "every breaker open", 5*time.Second, allIn(ls, resilient.BreakerOpen))
			time.Sleep(7 * time.Second)
			stop()
			wg.Wait()
			srv.Restart(t)
			waitFor(t, "every breaker closed with an empty journal", 10*time.Second, allIn(ls, resilient.BreakerClosed))

			// A unit per instance of rounding, and the probe's own.
			emission := time.Duration(p.Window.Microseconds()/p.Limit) * time.Microsecond
			for _, key := range []string{"abusive", "polite"} {
				d, err := decideWire(context.Background(), ls[0], ratelimit.Request{Policy: p, Key: key})
				if err != nil || d.Mode != ratelimit.ModeRedis {
					t.Fatalf("%s probe: %+v %v", key, d, err)
				}
				want := idealAt(p, key, grants[key], d.State.Now)
				t.Logf("%s: %d granted, %d remaining after replay (full in %v), ideal %d", key, len(grants[key]), d.Remaining, d.ResetAfter, want.Remaining)
				if d.Remaining > want.Remaining+1 {
					t.Errorf("%s: %d remaining after replay, more than the %d of an ideal limiter fed the %d grants: usage erased",
						key, d.Remaining, want.Remaining, len(grants[key]))
				}
				if key == "polite" && d.Remaining < want.Remaining-instances-1 {
					t.Errorf("polite: %d remaining after replay, want %d (an ideal limiter fed the %d grants) less at most a unit per instance",
						d.Remaining, want.Remaining, len(grants[key]))
				}
				if most := 2*p.Window + (instances+1)*emission; d.ResetAfter > most {
					t.Errorf("%s: full again in %v after replay, want at most %v (two capacities owed): the outage's grants were charged gross",
						key, d.ResetAfter, most)
				}
			}
		})
	}
}

// TestRecoveryWarmsThePool: an instance that started while Redis was down
// (or whose connections an outage took) holds warm connections once its
// breaker has closed, so its first decisions do not each pay a dial.
func TestRecoveryWarmsThePool(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	srv.Kill()
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{srv.Addr()}, Timeout: fleetTimeout, PoolSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	l, err := resilient.New(redisstore.New(c, redisstore.Config{}), recoveryConfig("app1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ls := []*resilient.Limiter{l}
	waitFor(t, "the breaker open", 5*time.Second, allIn(ls, resilient.BreakerOpen))
	time.Sleep(time.Second) // past the start's own warm-up (its dials give up after 500 ms)
	srv.Restart(t)
	waitFor(t, "the breaker closed", 10*time.Second, allIn(ls, resilient.BreakerClosed))
	waitFor(t, "warm connections", 2*time.Second, func() bool { return c.PoolStats().IdleConns >= 8 })
}

// TestDecideBatchThroughOutage: a batch is decided in Redis while it is up,
// each request as Decide would; when Redis dies, the batch's requests are
// decided locally, journaled, and replayed once Redis is back, so Redis
// ends holding every grant exactly once.
func TestDecideBatchThroughOutage(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	rs := newStore(t, srv.Addr())
	cfg := recoveryConfig("batch")
	cfg.ExpectedInstances = 1
	l, err := resilient.New(rs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	waitFor(t, "a heartbeat", 5*time.Second, func() bool { return l.Status().Live == 1 })
	log := longPolicy(ratelimit.SlidingWindowLog)
	gcra := longPolicy(ratelimit.GCRA)
	batch := func(mode ratelimit.Mode) {
		t.Helper()
		ds, errs := l.DecideBatch(context.Background(), []ratelimit.Request{
			{Policy: log, Key: "k:one"}, {Policy: gcra, Key: "ip:192.0.2.1"},
		})
		for i := range ds {
			if errs[i] != nil || !ds[i].Allowed || ds[i].Mode != mode {
				t.Fatalf("request %d: %+v, %v; want admitted in mode %s", i, ds[i], errs[i], mode)
			}
		}
	}
	for range 3 {
		batch(ratelimit.ModeRedis)
	}
	srv.Kill()
	waitFor(t, "the breaker to open", 5*time.Second, func() bool { return l.Breaker() == resilient.BreakerOpen })
	for range 4 {
		batch(ratelimit.ModeLocal)
	}
	srv.Restart(t)
	waitFor(t, "recovery", 10*time.Second, func() bool { return l.Breaker() == resilient.BreakerClosed && l.Status().Journal.Pending == 0 })
	c := srv.Client()
	if n, err := c.ZCard(context.Background(), rs.Key(log, "k:one")).Result(); err != nil || n != 7 {
		t.Errorf("the log holds %d grants (%v), want 7 (3 in Redis, 4 replayed)", n, err)
	}
	d, err := l.Decide(context.Background(), ratelimit.Request{Policy: gcra, Key: "ip:192.0.2.1"})
	if err != nil || d.Mode != ratelimit.ModeRedis || d.Remaining != gcra.Capacity()-8 {
		t.Errorf("GCRA after recovery: %+v, %v; want %d remaining (7 earlier grants and this one)", d, err, gcra.Capacity()-8)
	}
}

// TestRecoveryDoesNotBounceOnASlowHeartbeat: while the fleet replays, Redis
// is busy with the other instances' pipelines and a heartbeat can outlive
// its 50 ms. The store has just taken this instance's replay: it is slow,
// not dead, and the breaker goes on to close instead of reopening (a
// bounce: scripts/measure-drain.sh counts them).
func TestRecoveryDoesNotBounceOnASlowHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeStore()
		f.live.Store(1)
		l := newLimiter(t, f, resilient.Config{})
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.TokenBucket, Limit: 100, Window: time.Minute}
		f.down.Store(true)
		admit(t, l, p, "k", 3, ratelimit.ModeLocal)
		settle(time.Second)
		if l.Breaker() != resilient.BreakerOpen {
			t.Fatalf("%s, want open", l.Breaker())
		}
		f.slowBeats.Store(2)
		f.down.Store(false)
		settle(3 * time.Second)
		if st := l.Status(); st.Breaker != "closed" || st.Opens != 1 || st.Journal.Pending != 0 {
			t.Fatalf("breaker %s after %d openings, %d pending: want closed, opened once, journal empty", st.Breaker, st.Opens, st.Journal.Pending)
		}
	})
}

// TestReplayOfNothingIsNotSent: a token bucket key whose outage grants its
// share's refill has covered by the time Redis is back owes nothing, and
// its batch is acknowledged without touching Redis (its state, expired
// once full, is not written again, nor a marker), while a key granted just
// before Redis returned is charged and marked. The journal counts both as
// replayed. (Sent, such batches were most of the replay work of an outage
// of many keys: in a drain of 100 000 keys, about 60 % of the batches
// charged nothing.)
func TestReplayOfNothingIsNotSent(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	rs := newStore(t, srv.Addr())
	cfg := recoveryConfig("app1")
	cfg.ExpectedInstances = 1
	l, err := resilient.New(rs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	// A share refills its whole capacity in 2 s.
	p := ratelimit.Policy{Name: "refills", Algorithm: ratelimit.TokenBucket, Limit: 10, Window: 2 * time.Second}
	decide := func(k string, mode ratelimit.Mode) {
		t.Helper()
		if d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k}); err != nil || !d.Allowed || d.Mode != mode {
			t.Fatalf("%s: %+v %v, want admitted in mode %s", k, d, err, mode)
		}
	}
	keys := []string{"old-0", "old-1", "old-2", "late"}
	for _, k := range keys {
		decide(k, ratelimit.ModeRedis)
	}
	srv.Kill()
	waitFor(t, "the breaker open", 5*time.Second, func() bool { return l.Breaker() == resilient.BreakerOpen })
	for _, k := range keys[:3] {
		decide(k, ratelimit.ModeLocal)
	}
	// The old keys' shares are full again: a share starts when the others
	// hold it back (up to 0.5 s after the last heartbeat, before the kill)
	// and refills its capacity, and the grant, in 2.2 s.
	time.Sleep(3500 * time.Millisecond)
	for range 10 {
		decide("late", ratelimit.ModeLocal)
	}
	srv.Restart(t)
	waitFor(t, "the breaker closed with an empty journal", 10*time.Second, allIn([]*resilient.Limiter{l}, resilient.BreakerClosed))
	if st := l.Status().Journal; st.Replayed != 13 || st.Pending != 0 {
		t.Errorf("journal: %d replayed, %d pending; want 13 and 0", st.Replayed, st.Pending)
	}
	for _, k := range keys[:3] {
		if n := srv.Client().Exists(ctx, rs.Key(p, k)).Val(); n != 0 {
			t.Errorf("%s: charged nothing, yet the replay wrote its state", k)
		}
	}
	// Replay markers are keys of their own (redisstore.Store.Replay), one
	// per batch applied, named after the key's identity.
	marks, err := srv.Client().Keys(ctx, "*:replay:app1:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	late := store.IdentityOf("late")
	if len(marks) != 1 || !strings.HasSuffix(marks[0], fmt.Sprintf(":%x", late[:16])) {
		t.Errorf("replay markers %v, want the charged key's (late) alone", marks)
	}
}

// TestNoInstanceClosesBeforeEveryOneReplayed: after Redis comes back empty,
// an instance that restores (raises) its keys tells the fleet so with its
// heartbeat before it replays its journal; the others must not take that
// heartbeat for its replay. Here app2's replays are slow (its replay client
// goes through a proxy that delays every request): app1, which recovered
// first, decides in Redis again only once app2's journal is in Redis, or it
// would admit what app2's unreplayed grants had already used.
func TestNoInstanceClosesBeforeEveryOneReplayed(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	slow := redistest.StartProxy(t, srv.Addr())
	var ls []*resilient.Limiter
	for i := range 2 {
		c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{srv.Addr()}, Timeout: fleetTimeout, PoolSize: 8})
		if err != nil {
			t.Fatal(err)
		}
		replayAddr := srv.Addr()
		if i == 1 {
			replayAddr = slow.Addr()
		}
		rc, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{replayAddr}, Timeout: 5 * time.Second, PoolSize: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(); _ = rc.Close() })
		cfg := recoveryConfig(fmt.Sprint("app", i+1))
		cfg.ExpectedInstances, cfg.RecoveryWait, cfg.ReplayTimeout = 2, 20*time.Second, 5*time.Second
		l, err := resilient.New(redisstore.New(c, redisstore.Config{ReplayClient: rc}), cfg)
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
	for _, l := range ls {
		for range 20 {
			if d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"}); err != nil || !d.Allowed {
				t.Fatalf("local grant: %+v %v", d, err)
			}
		}
	}
	slow.RequestLatency(300 * time.Millisecond)
	srv.RestartEmpty(t)
	deadline := time.Now().Add(15 * time.Second)
	for ls[0].Breaker() != resilient.BreakerClosed {
		if time.Now().After(deadline) {
			t.Fatal("app1 did not close")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := ls[1].Status(); st.Journal.Pending > 0 {
		t.Fatalf("app1 decides in Redis again while app2 still holds %d units unreplayed (app2's breaker %s)", st.Journal.Pending, st.Breaker)
	}
	slow.ClearToxics()
	waitFor(t, "both breakers closed", 15*time.Second, allIn(ls, resilient.BreakerClosed))
}

// TestLastToOpenWaitsForTheInstancesAlreadyOut: app2 is cut off first, so
// by the time Redis dies app1's heartbeats count it suspect, not live. Redis
// comes back empty; app1 is back first, restores and raises. app2, live
// before the outage even if not at app1's last heartbeat, raises to its own
// (newer) snapshot when it comes back: app1 must replay its outage grants
// only after that raise, or the max-merge takes part of them back. Redis
// ends with every unit: app2's snapshot (5) and app1's local grants (2).
func TestLastToOpenWaitsForTheInstancesAlreadyOut(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	cut := redistest.StartProxy(t, srv.Addr())
	ls := startPair(t, [2]string{srv.Addr(), cut.Addr()}, func(c *resilient.Config) { c.RecoveryWait = 20 * time.Second })
	ctx := context.Background()
	p := ratelimit.Policy{Name: "outage-order", Algorithm: ratelimit.TokenBucket, Limit: 10, Window: time.Hour}
	decide := func(l *resilient.Limiter, n int, mode ratelimit.Mode) {
		t.Helper()
		for range n {
			if d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"}); err != nil || !d.Allowed || d.Mode != mode {
				t.Fatalf("%+v %v, want an admission in mode %s", d, err, mode)
			}
		}
	}
	decide(ls[0], 2, ratelimit.ModeRedis) // app1's snapshot: 2 used
	decide(ls[1], 3, ratelimit.ModeRedis) // app2's: 5 used
	cut.Disable()
	waitFor(t, "app1 counts app2 suspect", 5*time.Second, func() bool {
		st := ls[0].Status()
		return st.Live == 1 && st.Suspect == 1
	})
	srv.Kill()
	waitFor(t, "both breakers open", 5*time.Second, allIn(ls, resilient.BreakerOpen))
	decide(ls[0], 2, ratelimit.ModeLocal)
	srv.RestartEmpty(t)
	waitFor(t, "app1's raise", 10*time.Second, func() bool { return ls[0].Status().Raises >= 1 })
	time.Sleep(time.Second) // app2 still cut off
	cut.Enable()
	waitFor(t, "both breakers closed", 15*time.Second, allIn(ls, resilient.BreakerClosed))
	d, err := ls[0].Decide(ctx, ratelimit.Request{Policy: p, Key: "k"})
	if err != nil || d.Mode != ratelimit.ModeRedis {
		t.Fatalf("%+v %v", d, err)
	}
	if d.Remaining != 2 {
		t.Fatalf("%d left after 8 units, want 2: app2's raise after app1's replay took back part of app1's outage grants", d.Remaining)
	}
}

// TestLaterReplayLeavesNoMoreThanTheIdeal: two instances hammer a token
// bucket key through a Redis outage long enough for the bucket (and each
// share) to refill to full. app2 reaches Redis about a second after app1
// (its connection stays cut until app1 is back, and its client redials
// after a backoff; in a fleet, an instance restarted during the outage
// probes on a clock of its own), and grants from its share until it
// replays. Redis then holds no more than one bucket fed every grant in
// time order. Charged net of refill up to its own replay, app2's share,
// full, counted none of the refill Redis credited from app1's charge on,
// and Redis held about that second's grants too many. Dated from the
// fleet's cutoff, app2's charge must find the key app1's charge wrote
// (redisstore keeps a replayed key 10 s longer than its state matters).
func TestLaterReplayLeavesNoMoreThanTheIdeal(t *testing.T) {
	// Later still: app1's charge leaves the key about a second's refill
	// from full, and kept only a second more, it would expire before
	// app2's charge, dated from the cutoff, arrived (Redis then ended near
	// full: 50 units above the ideal).
	for _, later := range []time.Duration{0, 2 * time.Second} {
		t.Run(fmt.Sprint("later by ", later), func(t *testing.T) { laterReplay(t, later) })
	}
}

func laterReplay(t *testing.T, later time.Duration) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	late := redistest.StartProxy(t, srv.Addr())
	ls := startPair(t, [2]string{srv.Addr(), late.Addr()}, func(c *resilient.Config) {
		c.RecoveryWait = 10 * time.Second
		// The shares start refilling once the others hold them back:
		// soon, so that the outage costs the clients little.
		c.HeartbeatInterval, c.HeartbeatTTL = 20*time.Millisecond, 60*time.Millisecond
	})
	p := ratelimit.Policy{Name: "later", Algorithm: ratelimit.TokenBucket, Limit: 100, Window: 2 * time.Second}
	var (
		mu     sync.Mutex
		grants []store.Grant
		wg     sync.WaitGroup
	)
	ctx, stop := context.WithCancel(context.Background())
	for _, l := range ls {
		wg.Go(func() {
			for ctx.Err() == nil {
				if d, err := decideWire(ctx, l, ratelimit.Request{Policy: p, Key: "abusive"}); err == nil && d.Allowed {
					mu.Lock()
					grants = append(grants, store.Grant{At: d.State.Now, Cost: 1})
					mu.Unlock()
				}
				time.Sleep(5 * time.Millisecond) // 200/s each, against 50/s
			}
		})
	}
	time.Sleep(time.Second)
	late.Disable()
	srv.Kill()
	waitFor(t, "both breakers open", 5*time.Second, allIn(ls, resilient.BreakerOpen))
	time.Sleep(3 * time.Second) // the bucket and the shares refill to full
	srv.Restart(t)
	waitFor(t, "app1 back", 5*time.Second, func() bool { return ls[0].Breaker() != resilient.BreakerOpen })
	time.Sleep(later)
	late.Enable()
	waitFor(t, "app2 back", 5*time.Second, func() bool { return ls[1].Breaker() != resilient.BreakerOpen })
	stop()
	wg.Wait()
	waitFor(t, "both breakers closed", 15*time.Second, allIn(ls, resilient.BreakerClosed))
	waitFor(t, "both journals empty", 15*time.Second, func() bool {
		return ls[0].Status().Journal.Pending == 0 && ls[1].Status().Journal.Pending == 0
	})

	d, err := decideWire(context.Background(), ls[0], ratelimit.Request{Policy: p, Key: "abusive"})
	if err != nil || d.Mode != ratelimit.ModeRedis {
		t.Fatalf("probe: %+v %v", d, err)
	}
	want := idealAt(p, "abusive", grants, d.State.Now)
	t.Logf("%d granted; %d remaining after the replays, ideal %d", len(grants), d.Remaining, want.Remaining)
	if d.Remaining > want.Remaining+1 {
		t.Errorf("%d remaining after the replays, more than the %d of one bucket fed the %d grants", d.Remaining, want.Remaining, len(grants))
	}
}
