package resilient_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
	"github.com/redis/go-redis/v9"
)

// These tests check what Redis holds after an outage and a replay: the
// exact usage the fleet granted, each grant once, whatever fails on the way.

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
	return redisstore.New(c, redisstore.WithReplayClient(rc)), func() { _ = c.Close(); _ = rc.Close() }, nil
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
			if st := l.Status(); l.Breaker() != s || (s == resilient.Closed && (st.Journal.Pending > 0 || st.Recovering > 0)) {
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
			for _, alg := range ratelimit.Algorithms {
				grants.decide(t, l, alg, "client", fmt.Sprintf("redis-%d-%d", i, j), ratelimit.ModeRedis)
			}
		}
	}
	srv.Kill()
	waitFor(t, "every breaker open", 5*time.Second, allIn(ls, resilient.Open))
	for i, l := range ls {
		for _, alg := range ratelimit.Algorithms {
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
	d, err := l.Decide(context.Background(), ratelimit.Request{Policy: longPolicy(alg), Key: key, ID: id})
	if err != nil || !d.Allowed || d.Mode != mode {
		t.Fatalf("%s %s: %+v %v, want allowed in mode %s", alg, id, d, err, mode)
	}
	g[alg] = append(g[alg], store.Grant{At: d.State.Now, Cost: 1, ID: id})
}

// checkExactUsage compares what Redis holds with the grants.
func checkExactUsage(t *testing.T, srv *redistest.Server, probe *resilient.Limiter, key string, grants grantLog, othersLocal int64) {
	t.Helper()
	ctx := context.Background()
	rs := redisstore.New(srv.Client())
	for _, alg := range ratelimit.Algorithms {
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
			d, err := probe.Decide(ctx, ratelimit.Request{Policy: p, Key: key, ID: "probe-" + string(alg)})
			if err != nil || d.Mode != ratelimit.ModeRedis {
				t.Fatalf("%s probe: %+v %v", alg, d, err)
			}
			var now int64
			ideal := memstore.New(memstore.WithClock(func() time.Time { return time.UnixMicro(now) }))
			sorted := slices.Clone(g)
			algorithm.SortGrants(sorted)
			for _, x := range sorted {
				now = x.At
				_, _ = ideal.Decide(ctx, ratelimit.Request{Policy: p, Key: key})
			}
			now = d.State.Now
			want, _ := ideal.Decide(ctx, ratelimit.Request{Policy: p, Key: key})
			// Never above the ideal (usage erased); at most the other
			// instances' local grants below it (charged without refill).
			if d.Remaining > want.Remaining || d.Remaining < want.Remaining-othersLocal-1 {
				t.Errorf("%s: %d remaining after replay, ideal %d (allowed down to %d)", alg, d.Remaining, want.Remaining, want.Remaining-othersLocal-1)
			}
			t.Logf("%s: %d remaining after replay, ideal %d", alg, d.Remaining, want.Remaining)
		}
	}
}

// TestReplayLeavesExactUsage: four instances grant in Redis, then locally
// while Redis is killed, then replay; Redis holds exactly what was granted.
func TestReplayLeavesExactUsage(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	ls := startInstances(t, srv.Addr())
	grants := grantThroughOutage(t, srv, ls)
	srv.Restart(t)
	waitFor(t, "every breaker closed with an empty journal", 10*time.Second, allIn(ls, resilient.Closed))
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
	waitFor(t, "the breaker open", 5*time.Second, allIn([]*resilient.Limiter{l}, resilient.Open))
	for _, alg := range ratelimit.Algorithms {
		for j := range 20 {
			grants.decide(t, l, alg, "client", fmt.Sprintf("local-%d", j), ratelimit.ModeLocal)
		}
	}
	srv.Restart(t)
	waitFor(t, "the breaker closed with an empty journal", 10*time.Second, allIn([]*resilient.Limiter{l}, resilient.Closed))
	checkExactUsage(t, srv, l, "client", grants, 0)
	j := l.Status().Journal
	if j.Duplicates != 4 || j.DuplicateUnits != 80 || j.Granted != j.DuplicateUnits || j.Replayed != 0 {
		t.Errorf("journal %+v, want the 4 batches (80 units) refused as duplicates on the second send", j)
	}
}

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
	waitFor(t, "the breaker closed with an empty journal", 10*time.Second, allIn([]*resilient.Limiter{l}, resilient.Closed))
	ctx := context.Background()
	p := longPolicy(ratelimit.SlidingWindowLog)
	members, err := srv.Client().ZRange(ctx, redisstore.New(srv.Client()).Key(p, "client"), 0, -1).Result()
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
	waitFor(t, "the breaker closed with an empty journal", 10*time.Second, allIn([]*resilient.Limiter{l}, resilient.Closed))
	checkExactUsage(t, srv, l, "client", grants, 0)
	// Calls that reached Redis ran there; the replay finds them present.
	// (A failed call that never left the client, a dial that timed out,
	// say, is not present.)
	if j := l.Status().Journal; j.Present == 0 || j.Present > ran || j.Replayed+j.Present != 8 {
		t.Errorf("%d calls failed; journal %+v: want those that ran present, the rest replayed", ran, j)
	}
}

// TestMain lets the test binary run as a child limiter process (for the
// crash test); otherwise it runs the tests and the examples, with the
// examples' redis-server up.
func TestMain(m *testing.M) {
	if os.Getenv("RESILIENT_CHILD") != "" {
		runChild()
		return
	}
	os.Exit(redistest.Main(m))
}

// runChild serves a resilient limiter over stdin/stdout: "decide KEY N"
// answers the number admitted, "status" the status JSON.
func runChild() {
	rs, _, err := shippedStore(os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	cfg := recoveryConfig("app1")
	cfg.JournalDir = os.Getenv("JOURNAL_DIR")
	l, err := resilient.New(rs, cfg)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	in := bufio.NewScanner(os.Stdin)
	seq := 0
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 3 && f[0] == "decide":
			n, _ := strconv.Atoi(f[2])
			allowed := 0
			for range n {
				seq++
				d, err := l.Decide(context.Background(), ratelimit.Request{Policy: crashPolicy, Key: f[1], ID: fmt.Sprintf("%d-%d", os.Getpid(), seq)})
				if err == nil && d.Allowed {
					allowed++
				}
			}
			fmt.Println(allowed)
		case len(f) == 1 && f[0] == "status":
			b, _ := json.Marshal(l.Status())
			fmt.Println(string(b))
		}
	}
	_ = l.Close(context.Background())
}

// crashPolicy: 100 an hour, exact.
var crashPolicy = ratelimit.Policy{Name: "crash", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: time.Hour}

type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startChild(t *testing.T, redisAddr, journal string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RESILIENT_CHILD=1", "REDIS_ADDR="+redisAddr, "JOURNAL_DIR="+journal)
	cmd.Stderr = io.Discard
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
}

func (c *child) ask(t *testing.T, line string) string {
	t.Helper()
	if _, err := fmt.Fprintln(c.in, line); err != nil {
		t.Fatal(err)
	}
	if !c.out.Scan() {
		t.Fatalf("child: no answer to %q: %v", line, c.out.Err())
	}
	return c.out.Text()
}

func (c *child) decide(t *testing.T, key string, n int) int {
	t.Helper()
	a, err := strconv.Atoi(c.ask(t, fmt.Sprintf("decide %s %d", key, n)))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (c *child) status(t *testing.T) resilient.Status {
	t.Helper()
	var s resilient.Status
	if err := json.Unmarshal([]byte(c.ask(t, "status")), &s); err != nil {
		t.Fatal(err)
	}
	return s
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
					d, err := ls[i%len(ls)].Decide(ctx, ratelimit.Request{Policy: p, Key: key})
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
			waitFor(t, "every breaker open", 5*time.Second, allIn(ls, resilient.Open))
			time.Sleep(7 * time.Second)
			stop()
			wg.Wait()
			srv.Restart(t)
			waitFor(t, "every breaker closed with an empty journal", 10*time.Second, allIn(ls, resilient.Closed))

			// A unit per instance of rounding, and the probe's own.
			emission := time.Duration(p.WindowMicros()/p.Limit) * time.Microsecond
			for _, key := range []string{"abusive", "polite"} {
				d, err := ls[0].Decide(context.Background(), ratelimit.Request{Policy: p, Key: key})
				if err != nil || d.Mode != ratelimit.ModeRedis {
					t.Fatalf("%s probe: %+v %v", key, d, err)
				}
				var now int64
				ideal := memstore.New(memstore.WithClock(func() time.Time { return time.UnixMicro(now) }))
				sorted := slices.Clone(grants[key])
				algorithm.SortGrants(sorted)
				for _, g := range sorted {
					now = g.At
					_, _ = ideal.Decide(context.Background(), ratelimit.Request{Policy: p, Key: key})
				}
				now = d.State.Now
				want, _ := ideal.Decide(context.Background(), ratelimit.Request{Policy: p, Key: key})
				t.Logf("%s: %d granted, %d remaining after replay (full in %v), ideal %d", key, len(sorted), d.Remaining, d.ResetAfter, want.Remaining)
				if d.Remaining > want.Remaining+1 {
					t.Errorf("%s: %d remaining after replay, more than the %d of an ideal limiter fed the %d grants: usage erased",
						key, d.Remaining, want.Remaining, len(sorted))
				}
				if key == "polite" && d.Remaining < want.Remaining-instances-1 {
					t.Errorf("polite: %d remaining after replay, want %d (an ideal limiter fed the %d grants) less at most a unit per instance",
						d.Remaining, want.Remaining, len(sorted))
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
	l, err := resilient.New(redisstore.New(c), recoveryConfig("app1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ls := []*resilient.Limiter{l}
	waitFor(t, "the breaker open", 5*time.Second, allIn(ls, resilient.Open))
	time.Sleep(time.Second) // past the start's own warm-up (its dials give up after 500 ms)
	srv.Restart(t)
	waitFor(t, "the breaker closed", 10*time.Second, allIn(ls, resilient.Closed))
	waitFor(t, "warm connections", 2*time.Second, func() bool { return c.PoolStats().IdleConns >= 8 })
}

// TestCrashDuringOutage: a limiter process SIGKILLed during an outage is
// restarted, does not grant again the share it had granted, and replays
// its journal once Redis is back.
func TestCrashDuringOutage(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	journal := t.TempDir()
	first := startChild(t, srv.Addr(), journal)
	if n := first.decide(t, "client", 5); n != 5 {
		t.Fatalf("healthy: %d of 5 admitted", n)
	}
	srv.Kill()
	waitFor(t, "the first process's breaker to open", 5*time.Second, func() bool { return first.status(t).Breaker == "open" })
	// 95 left, and the heartbeats said this is the only live instance:
	// a share of 95, of which it spends 40.
	spent := first.decide(t, "client", 40)
	if spent != 40 {
		t.Fatalf("first process: %d local grants, want 40", spent)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()

	second := startChild(t, srv.Addr(), journal)
	st := second.status(t)
	if st.Breaker != "open" || st.Journal.Reloaded != uint64(spent) {
		t.Fatalf("restarted: breaker %s, journal %+v: want open with the %d grants reloaded", st.Breaker, st.Journal, spent)
	}
	// The journal kept what the share started from (95 left, one
	// instance): the restarted process grants the 55 the first one had not,
	// and not the 40 it had.
	if n := second.decide(t, "client", 100); n != 55 {
		t.Fatalf("restarted: %d more local grants, want 55: the spent share is not granted again", n)
	}
	srv.Restart(t)
	waitFor(t, "the restarted process to replay and close", 10*time.Second, func() bool {
		s := second.status(t)
		return s.Breaker == "closed" && s.Journal.Pending == 0
	})
	members, err := srv.Client().ZCard(context.Background(), redisstore.New(srv.Client()).Key(crashPolicy, "client")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if members != 5+40+55 {
		t.Fatalf("Redis holds %d grants, want 100 (5 in Redis, 40 before the crash, 55 after)", members)
	}
	if j := second.status(t).Journal; j.Replayed != 95 || j.Reloaded != 40 || j.Granted != 55 || j.Duplicates != 0 {
		t.Fatalf("journal %+v, want 40 reloaded and 55 granted, all 95 replayed, no duplicates", j)
	}
	if err := second.in.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		t.Fatal(err)
	}
}

// TestWipeRestoresUsage: Redis comes back without its data; the instances
// put back the usage their snapshots knew (once: the first restore of a key
// wins), then replay their journals on top.
func TestWipeRestoresUsage(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	ls := startInstances(t, srv.Addr())
	grantThroughOutage(t, srv, ls)
	srv.RestartEmpty(t)
	waitFor(t, "every breaker closed with an empty journal", 10*time.Second, allIn(ls, resilient.Closed))
	restores := 0
	for _, l := range ls {
		restores += int(l.Status().Restores)
	}
	if restores != instances {
		t.Errorf("%d restores, want one per instance", restores)
	}
	ctx := context.Background()
	for _, alg := range ratelimit.Algorithms {
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
	waitFor(t, "the breaker to open", 5*time.Second, func() bool { return l.Breaker() == resilient.Open })
	for range 4 {
		batch(ratelimit.ModeLocal)
	}
	srv.Restart(t)
	waitFor(t, "recovery", 10*time.Second, func() bool { return l.Breaker() == resilient.Closed && l.Status().Journal.Pending == 0 })
	c := srv.Client()
	if n, err := c.ZCard(context.Background(), rs.Key(log, "k:one")).Result(); err != nil || n != 7 {
		t.Errorf("the log holds %d grants (%v), want 7 (3 in Redis, 4 replayed)", n, err)
	}
	d, err := l.Decide(context.Background(), ratelimit.Request{Policy: gcra, Key: "ip:192.0.2.1"})
	if err != nil || d.Mode != ratelimit.ModeRedis || d.Remaining != gcra.Capacity()-8 {
		t.Errorf("GCRA after recovery: %+v, %v; want %d remaining (7 earlier grants and this one)", d, err, gcra.Capacity()-8)
	}
}

// TestRestartDuringOutage: an instance stopped during an outage (its journal
// left as a kill leaves it) comes back, does not hand out the share it had
// already spent, and replays its grants before trusting the store. Also when
// its journal ends in a torn record and a 2 MiB tail of zeros with no
// newline (what a crash mid-write can leave): it starts, serves, and replays
// the grants journaled before the damage. A torn record must not panic
// the start, nor a long tail fail it (a line scanner's "token too long").
func TestRestartDuringOutage(t *testing.T) {
	damage := map[string]func(t *testing.T, dir string){
		"clean journal": func(*testing.T, string) {},
		"torn record and a 2 MiB zero tail": func(t *testing.T, dir string) {
			jf, err := os.OpenFile(filepath.Join(dir, "journal.log"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = jf.WriteString("A\t5\tj\n") // a torn acknowledgement: 3 of its fields
			_, _ = jf.Write(make([]byte, 2<<20))
			if err := jf.Close(); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, damage := range damage {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				f := newFakeStore()
				p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.TokenBucket, Limit: 100, Window: time.Hour}
				cfg := resilient.Config{Instance: "app1", JournalDir: dir, ExpectedInstances: 4}
				first, err := resilient.New(f, cfg)
				if err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				f.down.Store(true)
				if got := admit(t, first, p, "k", 40, ratelimit.ModeLocal); got != 25 {
					t.Fatalf("first process: %d local grants, want a quarter of 100", got)
				}
				_ = first.Close(context.Background()) // the store is down: nothing replayed, nothing acknowledged
				damage(t, dir)

				second := newLimiter(t, f, cfg)
				if second.Breaker() != resilient.Open {
					t.Fatalf("restarted with a journal: %s, want open until replayed", second.Breaker())
				}
				if got := admit(t, second, p, "other", 10, ratelimit.ModeLocal); got != 10 {
					t.Fatalf("restarted: %d of 10 requests of a fresh key admitted locally, want it to serve", got)
				}
				if got := admit(t, second, p, "k", 40, ratelimit.ModeLocal); got != 0 {
					t.Fatalf("restarted: %d more local grants, want 0: the share was spent", got)
				}
				f.down.Store(false)
				settle(2 * time.Second)
				if second.Breaker() != resilient.Closed {
					t.Fatalf("%s, want closed after replay", second.Breaker())
				}
				d, err := second.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
				if err != nil || d.Mode != ratelimit.ModeRedis || d.Remaining != 74 {
					t.Fatalf("after replay: %+v %v, want the store to hold the 25 grants (74 left)", d, err)
				}
			})
		})
	}
}

// TestRestartDuringOutageChargesTheWholeShare: the grants of a process
// killed during an outage and those of the process that took over from its
// journal are one share: replayed, they leave the store no more tokens than
// a bucket fed every grant in time order. Charged batch by batch, each
// batch's share counted again the refill the other's grants took, and the
// store ended with its bucket nearly full (99 where the ideal held 85).
func TestRestartDuringOutageChargesTheWholeShare(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				f := newFakeStore()
				f.live.Store(1)
				p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
				cfg := resilient.Config{Instance: "app1", JournalDir: dir, ExpectedInstances: 1}
				var now int64
				ideal := memstore.New(memstore.WithClock(func() time.Time { return time.UnixMicro(now) }))
				decide := func(l *resilient.Limiter, mode ratelimit.Mode) bool {
					d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
					if err != nil || d.Mode != mode {
						t.Fatalf("%+v %v, want a %s decision", d, err, mode)
					}
					if d.Allowed {
						now = time.Now().UnixMicro()
						_, _ = ideal.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
					}
					return d.Allowed
				}
				first, err := resilient.New(f, cfg)
				if err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				for range 100 {
					decide(first, ratelimit.ModeRedis) // the bucket drained
				}
				f.down.Store(true)
				for range 100 { // 20/s for 5 s against 10/s
					decide(first, ratelimit.ModeLocal)
					time.Sleep(50 * time.Millisecond)
				}
				_ = first.Close(context.Background()) // the store is down: nothing replayed, as a kill leaves it

				second := newLimiter(t, f, cfg)
				for range 100 {
					decide(second, ratelimit.ModeLocal)
					time.Sleep(50 * time.Millisecond)
				}
				time.Sleep(6 * time.Second)
				f.down.Store(false)
				settle(2 * time.Second)
				if second.Breaker() != resilient.Closed {
					t.Fatalf("%s, want closed after replay", second.Breaker())
				}
				d, err := second.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
				if err != nil || d.Mode != ratelimit.ModeRedis {
					t.Fatalf("after replay: %+v %v", d, err)
				}
				now = time.Now().UnixMicro()
				want, _ := ideal.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"})
				t.Logf("after replay %d left, an ideal bucket fed every grant %d", d.Remaining, want.Remaining)
				if d.Remaining > want.Remaining {
					t.Errorf("after replay the store holds %d, more than the %d of a bucket fed every grant", d.Remaining, want.Remaining)
				}
			})
		})
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
		if l.Breaker() != resilient.Open {
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

// TestClusterShardWipeIsRestored: on a 3-master Cluster, a master that does
// not hold the fleet's keys loses its data. The per-range generations notice
// it, and the usage the snapshots knew is put back for the keys of that
// master only: keys on the other masters are not charged twice.
func TestClusterShardWipeIsRestored(t *testing.T) {
	cl := redistest.StartCluster(t)
	client := redis.NewClusterClient(cl.ClusterOptions())
	t.Cleanup(func() { _ = client.Close() })
	rs := redisstore.New(client, redisstore.WithTimeout(time.Second))
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
	fleetMaster := cl.MasterFor(rs.FleetKey())
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
	waitFor(t, "the breaker closed", 5*time.Second, allIn([]*resilient.Limiter{l}, resilient.Closed))
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
	waitFor(t, "the breaker open", 5*time.Second, func() bool { return l.Breaker() == resilient.Open })
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
	waitFor(t, "the breaker closed with an empty journal", 10*time.Second, allIn([]*resilient.Limiter{l}, resilient.Closed))
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
		l, err := resilient.New(redisstore.New(c, redisstore.WithReplayClient(rc)), cfg)
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
	waitFor(t, "both breakers open", 5*time.Second, allIn(ls, resilient.Open))
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
	for ls[0].Breaker() != resilient.Closed {
		if time.Now().After(deadline) {
			t.Fatal("app1 did not close")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := ls[1].Status(); st.Journal.Pending > 0 {
		t.Fatalf("app1 decides in Redis again while app2 still holds %d units unreplayed (app2's breaker %s)", st.Journal.Pending, st.Breaker)
	}
	slow.ClearToxics()
	waitFor(t, "both breakers closed", 15*time.Second, allIn(ls, resilient.Closed))
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
	rs := redisstore.New(client, redisstore.WithTimeout(50*time.Millisecond), redisstore.WithCoalescing(4))
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
	rs := redisstore.New(srv.Client())
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
	waitFor(t, "both breakers open", 5*time.Second, allIn(ls, resilient.Open))
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
	waitFor(t, "both breakers closed", 15*time.Second, allIn(ls, resilient.Closed))
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
	var ls []*resilient.Limiter
	for i, addr := range []string{srv.Addr(), cut.Addr()} {
		cfg := recoveryConfig(fmt.Sprint("app", i+1))
		cfg.ExpectedInstances, cfg.RecoveryWait = 2, 20*time.Second
		l, err := resilient.New(newStore(t, addr), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		ls = append(ls, l)
	}
	waitFor(t, "heartbeats", 5*time.Second, func() bool { return ls[0].Status().Live == 2 && ls[1].Status().Live == 2 })
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
	waitFor(t, "both breakers open", 5*time.Second, allIn(ls, resilient.Open))
	decide(ls[0], 2, ratelimit.ModeLocal)
	srv.RestartEmpty(t)
	waitFor(t, "app1's raise", 10*time.Second, func() bool { return ls[0].Status().Raises >= 1 })
	time.Sleep(time.Second) // app2 still cut off
	cut.Enable()
	waitFor(t, "both breakers closed", 15*time.Second, allIn(ls, resilient.Closed))
	d, err := ls[0].Decide(ctx, ratelimit.Request{Policy: p, Key: "k"})
	if err != nil || d.Mode != ratelimit.ModeRedis {
		t.Fatalf("%+v %v", d, err)
	}
	if d.Remaining != 2 {
		t.Fatalf("%d left after 8 units, want 2: app2's raise after app1's replay took back part of app1's outage grants", d.Remaining)
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
	if l.Status().Breaker != resilient.Closed.String() {
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
	w := p.WindowMicros()
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
	cfg := recoveryConfig("app1")
	cfg.ExpectedInstances = 1
	l, err := resilient.New(redisstore.New(client, redisstore.WithTimeout(fleetTimeout), redisstore.WithCoalescing(4)), cfg)
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
	p := ratelimit.Policy{Name: "closed", Algorithm: ratelimit.SlidingWindowLog, Limit: 10, Window: time.Hour, FailureMode: ratelimit.FailClosed}
	rs := redisstore.New(srv.Client())
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
