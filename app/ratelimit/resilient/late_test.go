package resilient_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// TestPausedDecisionsCountOnce: decisions that timed out against a paused
// Redis run when it resumes; their local grants carry the same request ids,
// so the sliding window log holds each request once.
func TestPausedDecisionsCountOnce(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	l, err := resilient.New(newStore(t, srv.Addr()), recoveryConfig("app1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	waitFor(t, "a heartbeat", 5*time.Second, func() bool { return l.Status().Live == 1 })
	(grantLog{}).decide(t, l, ratelimit.SlidingWindowLog, "warm-up", "warm-up", ratelimit.ModeRedis)
	srv.Stop()
	grants := grantLog{}
	for j := range 8 {
		grants.decide(t, l, ratelimit.SlidingWindowLog, "client", fmt.Sprintf("paused-%d", j), ratelimit.ModeLocal)
	}
	sent := l.Status().FailedDecisions
	srv.Cont()
	waitFor(t, "the breaker closed with an empty journal", 10*time.Second, allIn([]*resilient.Limiter{l}, resilient.BreakerClosed))
	ctx := context.Background()
	p := longPolicy(ratelimit.SlidingWindowLog)
	members, err := srv.Client().ZRange(ctx, redisstore.New(srv.Client(), redisstore.Config{}).Key(p, "client"), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 8 {
		t.Fatalf("log holds %v, want the 8 requests once each", members)
	}
	// The first call went out on a pooled connection and waited in Redis'
	// socket; Redis ran it on SIGCONT, before the replay found it present.
	j := l.Status().Journal
	if j.Present == 0 || j.Replayed+j.Present != 8 {
		t.Errorf("journal %+v: want the queued call present and the rest replayed", j)
	}
	t.Logf("%d calls reached the paused Redis, %d of them found present at replay", sent, j.Present)
}

// TestTimedOutDecisionsThatRanCountOnce: with every reply delayed past the
// timeout, the calls still run in Redis; the local grants carry the same
// request ids, so the replay finds them present and the log counts each
// request once.
func TestTimedOutDecisionsThatRanCountOnce(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	px := redistest.StartProxy(t, srv.Addr())
	l, err := resilient.New(newStore(t, px.Addr()), recoveryConfig("app1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	waitFor(t, "a heartbeat", 5*time.Second, func() bool { return l.Status().Live == 1 })
	// One decision first, so Redis has the function library loaded: a
	// delayed "Function not found" would keep the call from running at all.
	(grantLog{}).decide(t, l, ratelimit.SlidingWindowLog, "warm-up", "warm-up", ratelimit.ModeRedis)
	px.Latency(300 * time.Millisecond)
	grants := grantLog{}
	for j := range 8 {
		grants.decide(t, l, ratelimit.SlidingWindowLog, "client", fmt.Sprintf("slow-%d", j), ratelimit.ModeLocal)
	}
	ran := l.Status().FailedDecisions
	px.ClearToxics()
	waitFor(t, "the breaker closed with an empty journal", 10*time.Second, allIn([]*resilient.Limiter{l}, resilient.BreakerClosed))
	checkExactUsage(t, srv, l, "client", grants, 0)
	// Calls that reached Redis ran there; the replay finds them present.
	// (A failed call that never left the client, a dial that timed out,
	// say, is not present.)
	if j := l.Status().Journal; j.Present == 0 || j.Present > ran || j.Replayed+j.Present != 8 {
		t.Errorf("%d calls failed; journal %+v: want those that ran present, the rest replayed", ran, j)
	}
}

// lateReplyLimiter starts a limiter with a 50 ms timeout and the given
// LateGrace on a store that reads late replies, behind a proxy whose
// latency the test sets, after one decision in Redis.
func lateReplyLimiter(t *testing.T, grace time.Duration) (*resilient.Limiter, *redistest.Proxy, *redistest.Server) {
	t.Helper()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	px := redistest.StartProxy(t, srv.Addr())
	client, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{px.Addr()}, Timeout: 50 * time.Millisecond, PoolSize: 8, LateReplies: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	rs := redisstore.New(client, redisstore.Config{Timeout: 50 * time.Millisecond, Coalescing: 4})
	cfg := recoveryConfig("app1")
	cfg.Timeout, cfg.LateGrace, cfg.HeartbeatTTL = 50*time.Millisecond, grace, 5*time.Second
	l, err := resilient.New(rs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	waitFor(t, "a heartbeat", 5*time.Second, func() bool { return l.Status().Live == 1 })
	warm := ratelimit.Policy{Name: "warm", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Hour}
	if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: warm, Key: "warm"}); err != nil {
		t.Fatal(err)
	}
	return l, px, srv
}

// TestLateAnswerWithinGraceIsTaken: every reply comes 60 ms after its call,
// past the 50 ms timeout but within the grace after it: each request gets
// the store's own answer (counted once, in Redis), none a local one.
func TestLateAnswerWithinGraceIsTaken(t *testing.T) {
	// Replies take 60 ms against the 50 ms timeout; the grace is ample, so
	// that a slow test machine does not push them past it.
	l, px, _ := lateReplyLimiter(t, time.Second)
	p := ratelimit.Policy{Name: "grace", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Hour}
	px.Latency(60 * time.Millisecond)
	admitted := 0
	for i := range 20 {
		d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Mode != ratelimit.ModeRedis {
			t.Fatalf("request %d: mode %s, want the store's late answer", i, d.Mode)
		}
		if d.Allowed {
			admitted++
		}
	}
	if st := l.Status(); admitted != 10 || st.Journal.Granted != 0 || st.Late.Awaited == 0 {
		t.Fatalf("%d admitted, journal %+v, late %+v: want the limit's 10, all in Redis, awaited late", admitted, st.Journal, st.Late)
	}
}

// TestDecisionWaitsNoLongerThanTimeout: every reply comes 55 ms after its
// call, past the 50 ms timeout. By default (LateGrace 0) no request waits
// past the timeout for it, since the timeout is the decision's latency
// bound (the chaos suite's is the timeout plus 25 ms): each is decided
// locally, none by the late answer.
func TestDecisionWaitsNoLongerThanTimeout(t *testing.T) {
	l, px, _ := lateReplyLimiter(t, 0)
	p := ratelimit.Policy{Name: "bound", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Hour}
	px.Latency(55 * time.Millisecond)
	for i := range 10 {
		d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if d.Mode == ratelimit.ModeRedis {
			t.Fatalf("request %d: the store's answer, which came after the timeout: want a local decision", i)
		}
	}
	if st := l.Status(); st.Late.Awaited != 0 {
		t.Fatalf("late %+v: want no request answered by a late reply", st.Late)
	}
}

// TestSlowStoreRefunds: behind a Redis whose replies come 60 ms after
// their calls, past the 50 ms timeout, requests are refused locally (the
// last snapshot said their keys were spent) while Redis, whose keys were
// emptied meanwhile, admits them. Each such admission is refunded: applied
// in Redis, which ends holding none of them, and counted as refunded. A
// refund bounded by the 50 ms timeout timed out behind the same latency,
// and the clients stayed charged for requests they were refused.
func TestSlowStoreRefunds(t *testing.T) {
	l, px, srv := lateReplyLimiter(t, 0)
	ctx := context.Background()
	p := ratelimit.Policy{Name: "refunds", Algorithm: ratelimit.SlidingWindowLog, Limit: 1, Window: time.Hour}
	const keys = 5
	rs := redisstore.New(srv.Client(), redisstore.Config{})
	for i := range keys {
		k := fmt.Sprint("k", i)
		if d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k}); err != nil || !d.Allowed || d.Mode != ratelimit.ModeRedis {
			t.Fatalf("%s: %+v %v: want admitted in Redis", k, d, err)
		}
		if err := srv.Client().Del(ctx, rs.Key(p, k)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	px.Latency(60 * time.Millisecond)
	for i := range keys {
		d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: fmt.Sprint("k", i)})
		if err != nil || d.Allowed || d.Mode == ratelimit.ModeRedis {
			t.Fatalf("k%d: %+v %v: want refused locally, from the spent snapshot", i, d, err)
		}
	}
	waitFor(t, "every admission refunded", 5*time.Second, func() bool {
		st := l.Status().Late
		return st.Overcounted == keys && st.Refunded == keys
	})
	for i := range keys {
		if n, err := srv.Client().ZCard(ctx, rs.Key(p, fmt.Sprint("k", i))).Result(); err != nil || n != 0 {
			t.Fatalf("k%d: Redis holds %d admissions (%v), want none: each was refunded", i, n, err)
		}
	}
}

// TestLateGrantOfAnUnseenKeyIsChargedInFull: a key this instance never
// had a reply for, saturated in Redis by another instance, is decided
// locally while the breaker stays closed (its call timed out). Redis goes
// on deciding for the others meanwhile, so the local share has no refill
// of its own: when the late reply says Redis refused the request, the
// local grant is charged in full, however late the replay (here after the
// share would have refilled, which an outage's replay nets out).
func TestLateGrantOfAnUnseenKeyIsChargedInFull(t *testing.T) {
	srv, slow, l := behindSlowProxy(t)
	other := newStore(t, srv.Addr())
	ctx := context.Background()
	// Two units, refilled in 2 s.
	p := ratelimit.Policy{Name: "unseen", Algorithm: ratelimit.TokenBucket, Limit: 2, Window: 2 * time.Second}
	admitted := func() int {
		n := 0
		for {
			d, err := other.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"})
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				return n
			}
			n++
		}
	}
	waitFor(t, "a heartbeat", 5*time.Second, func() bool { return l.Status().Live == 1 })
	// Connections open before the latency: a dial's handshake would
	// delay the call past the bucket's refill.
	for i := range 4 {
		if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: fmt.Sprint("warm-", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := admitted(); n != 2 {
		t.Fatalf("the other instance got %d, want 2", n)
	}
	slow.Latency(4 * time.Second)
	d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: "late-1"})
	slow.Latency(0)
	if err != nil || !d.Allowed || d.Mode != ratelimit.ModeLocal {
		t.Fatalf("%+v %v, want a local grant", d, err)
	}
	waitFor(t, "the late reply and the replay", 10*time.Second, func() bool {
		st := l.Status()
		return st.Late.Counted+st.Late.Present+st.Late.Unknown+st.Late.Expired > 0 && st.Journal.Pending == 0
	})
	if st := l.Status(); st.Late.Counted != 1 {
		t.Fatalf("late %+v, journal %+v: want the grant counted (Redis refused the request)", st.Late, st.Journal)
	}
	if l.Status().Breaker != string(resilient.BreakerClosed) {
		t.Fatalf("breaker %s, want closed throughout", l.Status().Breaker)
	}
	// Redis' bucket was full again before the replay: the charge leaves
	// one unit.
	if n := admitted(); n != 1 {
		t.Fatalf("the other instance got %d after the replay, want 1: the local grant was not charged", n)
	}
}

// TestBatchOfOneIDSettlesEachPolicy: one HTTP request's policies share its
// id. Both calls time out and both keys are granted locally; Redis had
// refused A (spent by another instance) and admitted B. Each late reply
// settles its own policy's grant: B's is dropped (Redis counted it), A's
// is charged (it had not), so A ends one unit in debt and B holds one use.
func TestBatchOfOneIDSettlesEachPolicy(t *testing.T) {
	srv, slow, l := behindSlowProxy(t)
	other := newStore(t, srv.Addr())
	ctx := context.Background()
	p := ratelimit.Policy{Name: "one-id", Algorithm: ratelimit.TokenBucket, Limit: 3, Window: time.Hour}
	waitFor(t, "a heartbeat", 5*time.Second, func() bool { return l.Status().Live == 1 })
	for i := range 4 { // connections open before the latency
		if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: fmt.Sprint("warm-", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if d, err := other.Decide(ctx, ratelimit.Request{Policy: p, Key: "A"}); err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
	}
	slow.Latency(400 * time.Millisecond)
	ds, errs := l.DecideBatch(ctx, []ratelimit.Request{{Policy: p, Key: "B", ID: "req-1"}, {Policy: p, Key: "A", ID: "req-1"}})
	slow.Latency(0)
	for i, d := range ds {
		if errs[i] != nil || !d.Allowed || d.Mode != ratelimit.ModeLocal {
			t.Fatalf("request %d: %+v %v, want a local grant", i, d, errs[i])
		}
	}
	waitFor(t, "the late replies and the replay", 10*time.Second, func() bool {
		st := l.Status()
		return st.Late.Present+st.Late.Counted >= 1 && st.Journal.Pending == 0 && st.Journal.Doubts == 0
	})
	time.Sleep(300 * time.Millisecond) // the replay of a grant the second reply settled
	w := p.Window.Microseconds()
	tokens := func(k string) float64 {
		t.Helper()
		a, _, err := redistest.PairState(ctx, srv.Client(), other.Key(p, k))
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.ParseFloat(a, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v / float64(w)
	}
	if a := tokens("A"); a > -0.5 {
		t.Errorf("A holds %.3f tokens, want about -1: its local grant, which Redis had refused, was not charged", a)
	}
	if b := tokens("B"); b < 1.5 || b > 2.5 {
		t.Errorf("B holds %.3f tokens, want about 2: Redis counted its request once", b)
	}
}

// behindSlowProxy starts a Redis, a proxy to it and one instance through the
// proxy, as the service ships it (coalescing, late replies read for 5 s),
// the only one of its fleet.
func behindSlowProxy(t *testing.T) (*redistest.Server, *redistest.Proxy, *resilient.Limiter) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	slow := redistest.StartProxy(t, srv.Addr())
	client, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{slow.Addr()}, Timeout: fleetTimeout, PoolSize: 8, LateReplies: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	// Every connection of the pool open before a test slows the replies:
	// a call that had to dial would wait for the handshake's delayed reply
	// before its command reached Redis, and reach it too late for what the
	// test means to show (heartbeats hold connections for the whole delay).
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { _ = client.Do(context.Background(), "BLPOP", "warm-the-pool", "0.05").Err() })
	}
	wg.Wait()
	cfg := recoveryConfig("app1")
	cfg.ExpectedInstances = 1
	l, err := resilient.New(redisstore.New(client, redisstore.Config{Timeout: fleetTimeout, Coalescing: 4}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return srv, slow, l
}

// TestFailClosedRefundsALateAdmission: a fail-closed policy behind a Redis
// whose replies come after the timeout: each request is refused (closed),
// and Redis, which admitted it late, is refunded, ending with none of
// them: a login limit does not lock polite users out sooner.
func TestFailClosedRefundsALateAdmission(t *testing.T) {
	l, px, srv := lateReplyLimiter(t, 0)
	ctx := context.Background()
	p := ratelimit.Policy{Name: "closed", Algorithm: ratelimit.SlidingWindowLog, Limit: 10, Window: time.Hour, FailureMode: ratelimit.ModeClosed}
	rs := redisstore.New(srv.Client(), redisstore.Config{})
	px.Latency(60 * time.Millisecond)
	const n = 3
	for i := range n {
		d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"})
		if err != nil || d.Allowed || d.Mode != ratelimit.ModeClosed {
			t.Fatalf("request %d: %+v %v: want refused, fail closed", i, d, err)
		}
	}
	waitFor(t, "every late admission refunded", 5*time.Second, func() bool {
		st := l.Status().Late
		return st.Overcounted == n && st.Refunded == n
	})
	if c, err := srv.Client().ZCard(ctx, rs.Key(p, "k")).Result(); err != nil || c != 0 {
		t.Fatalf("Redis holds %d admissions (%v), want none: each was refunded", c, err)
	}
}
