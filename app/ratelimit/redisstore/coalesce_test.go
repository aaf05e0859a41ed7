package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/conformance"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// roundTrips counts the commands and pipelines a client sends.
type roundTrips struct{ cmds, pipelines atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.cmds.Add(1); return next(ctx, cmd) }
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.pipelines.Add(1); return next(ctx, cmds) }
}

// TestCoalescedConformance: with coalescing on, every algorithm gives the
// answers it gives alone.
func TestCoalescedConformance(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	conformance.Run(t, ratelimit.ModeRedis, func(t *testing.T) ratelimit.Limiter {
		return redisstore.New(newClient(t, srv.Addr()), redisstore.Config{Coalescing: 2})
	})
}

// TestCoalescing: 64 goroutines deciding at once share pipelines (far fewer
// round trips than calls), and the admissions stay exact: exactly the limit
// of a key is admitted, whichever pipeline carried each call. Four
// instances share only Redis.
func TestCoalescing(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	for _, alg := range contract.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			p := ratelimit.Policy{Name: "co", Algorithm: alg, Limit: 500, Window: time.Hour}
			var rt roundTrips
			var ls []*redisstore.Store
			for range 4 {
				c := newClient(t, srv.Addr())
				c.AddHook(&rt)
				ls = append(ls, redisstore.New(c, redisstore.Config{Coalescing: 2, Timeout: 5 * time.Second}))
			}
			const calls = 2000
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Go(func() {
					for i := range calls / 64 {
						d, err := ls[g%4].Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k", ID: fmt.Sprint(g, "-", i)})
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if got := admitted.Load(); got != p.Limit {
				t.Fatalf("%d admitted, want exactly %d", got, p.Limit)
			}
			n := calls / 64 * 64
			if trips := rt.pipelines.Load() + rt.cmds.Load(); trips >= int64(n)*3/4 {
				t.Fatalf("%d round trips for %d calls: they were not coalesced", trips, n)
			}
			t.Logf("%d calls in %d pipelines and %d single commands", n, rt.pipelines.Load(), rt.cmds.Load())
		})
	}
}

// TestCoalescingLoneCaller: a caller alone sends at once, one round trip
// per call (a plain command: nothing to share), and a cancelled call is not
// sent.
func TestCoalescingLoneCaller(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	var rt roundTrips
	c := newClient(t, srv.Addr())
	c.AddHook(&rt)
	l := redisstore.New(c, redisstore.Config{Coalescing: 2})
	p := ratelimit.Policy{Name: "lone", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Second}
	if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"}); err != nil {
		t.Fatal(err) // loads the script
	}
	trips := func() int64 { return rt.pipelines.Load() + rt.cmds.Load() }
	base := trips()
	for i := range 5 {
		if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"}); err != nil {
			t.Fatal(err)
		}
		if got := trips() - base; got != int64(i+1) {
			t.Fatalf("call %d: %d round trips, want one per call", i, got)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"}); err == nil {
		t.Fatal("a cancelled call was answered")
	}
	if got := trips() - base; got != 5 {
		t.Fatalf("%d round trips: the cancelled call was sent", got)
	}
}

// TestBatchAfterFunctionFlushLoadsOnce: after Redis lost its functions (a
// restart without persistence, FUNCTION FLUSH), a pipeline of 200
// decisions (several batch function calls, a batch holding at most 64)
// loads the library once, not once per call (which held the shared
// pipeline for a round trip per call right when Redis came back), and
// every decision still counts once: exactly the limit's members in the
// key's log in Redis.
func TestBatchAfterFunctionFlushLoadsOnce(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	p := ratelimit.Policy{Name: "flush", Algorithm: ratelimit.SlidingWindowLog, Limit: 30, Window: time.Hour}
	warm := []ratelimit.Request{{Policy: p, Key: "warm"}, {Policy: p, Key: "warm"}}
	if _, errs := l.DecideBatch(ctx, warm); errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if err := c.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	reqs := make([]ratelimit.Request, 200)
	for i := range reqs {
		reqs[i] = ratelimit.Request{Policy: p, Key: "k"}
	}
	scriptLoads := func() int64 { return commandCalls(t, c, "function|load") }
	before := scriptLoads()
	ds, errs := l.DecideBatch(ctx, reqs)
	admitted := 0
	for i := range ds {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if ds[i].Allowed {
			admitted++
		}
	}
	if admitted != 30 {
		t.Fatalf("%d admitted, want exactly 30", admitted)
	}
	if loads := scriptLoads() - before; loads != 1 {
		t.Fatalf("%d FUNCTION LOADs for one pipeline, want 1", loads)
	}
	if n, err := c.ZCard(ctx, l.Key(p, "k")).Result(); err != nil || n != 30 {
		t.Fatalf("the key holds %d grants (%v), want exactly 30", n, err)
	}
}

// TestPingLoadsScripts: a successful Ping (the breaker's probe) leaves the
// function library loaded, so the first decisions after a Redis restart
// do not each pay "Function not found" and a FUNCTION LOAD.
func TestPingLoadsScripts(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	if err := c.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil || len(libs) != 1 || libs[0].Name != "fleetlimit_"+redisstore.LibraryVersion() {
		t.Fatalf("libraries after Ping: %+v %v, want fleetlimit_%s", libs, err, redisstore.LibraryVersion())
	}
	have := map[string]bool{}
	for _, f := range libs[0].Functions {
		have[f.Name] = true
	}
	for _, alg := range contract.Algorithms {
		if _, fn := redisstore.Library(alg); !have[fn] {
			t.Fatalf("%s: function %s not loaded after Ping (%v)", alg, fn, have)
		}
	}
}

// TestLoadLibraryKeepsLoaded: loading the library where it is already
// (every Ping after the first) succeeds and leaves one library, whose
// functions still decide.
func TestLoadLibraryKeepsLoaded(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	for i := range 3 {
		if err := l.Ping(ctx); err != nil {
			t.Fatalf("Ping %d: %v", i, err)
		}
	}
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil || len(libs) != 1 {
		t.Fatalf("libraries: %+v %v, want one", libs, err)
	}
	p := ratelimit.Policy{Name: "kept", Algorithm: ratelimit.GCRA, Limit: 2, Window: time.Minute}
	if d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"}); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("%+v %v", d, err)
	}
}

// TestCoalescedCallKeepsItsDeadline: two calls share a pipeline, one with a
// deadline that ends while the pipeline is out. That call fails at its
// deadline; the other, whose deadline is later, still gets its decision (a
// pipeline bounded by the earliest deadline of its calls failed both).
func TestCoalescedCallKeepsItsDeadline(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	px := redistest.StartProxy(t, srv.Addr())
	o := srv.Options()
	o.Addr = px.Addr()
	o.ReadTimeout = 5 * time.Second
	// As the service's client (ClientConfig): a call's context deadline
	// bounds its reads, so a pipeline's deadline is what cuts it.
	o.ContextTimeoutEnabled = true
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	// One pipeline in flight at a time: calls made meanwhile queue for the
	// next one.
	l := redisstore.New(c, redisstore.Config{Coalescing: 1, Timeout: 5 * time.Second})
	p := ratelimit.Policy{Name: "deadline", Algorithm: ratelimit.GCRA, Limit: 100, Window: time.Second}
	if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "warm"}); err != nil {
		t.Fatal(err) // loads the script
	}
	px.Latency(300 * time.Millisecond)

	var wg sync.WaitGroup
	decide := func(key string, timeout time.Duration, err *error) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_, *err = l.Decide(ctx, ratelimit.Request{Policy: p, Key: key})
		})
	}
	var first, short, long error
	decide("first", 5*time.Second, &first) // out for 300 ms
	time.Sleep(20 * time.Millisecond)
	decide("short", 400*time.Millisecond, &short) // its pipeline leaves at ~300 ms, back at ~600 ms
	decide("long", 5*time.Second, &long)
	wg.Wait()
	if first != nil {
		t.Fatalf("first call: %v", first)
	}
	if short == nil {
		t.Errorf("the call whose deadline ended while its pipeline was out was answered")
	} else if !errors.Is(short, context.DeadlineExceeded) {
		t.Errorf("short call: %v, want its deadline", short)
	}
	if long != nil {
		t.Errorf("the call with the later deadline failed with the shorter one's: %v", long)
	}
}

// TestLateRepliesAccountForEveryDecision: callers with deadlines across the
// round trip, on a Redis whose replies come at random times. Every request
// ends exactly once: answered to its caller, or handed to the late handler
// (OnLate) once the caller has gone. What Redis counted is what the
// callers and the late handler were told was admitted: no decision Redis
// made is lost between Redis and its caller, even when the answer and the
// deadline come at the same moment.
func TestLateRepliesAccountForEveryDecision(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	px := redistest.StartProxy(t, srv.Addr())
	client, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{px.Addr()}, Timeout: time.Second, PoolSize: 16, LateReplies: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	l := redisstore.New(client, redisstore.Config{Coalescing: 2, Timeout: time.Second})
	var (
		mu          sync.Mutex
		late        = map[string]int{}
		lateAllowed int
	)
	if !l.Ext().OnLate(5*time.Second, func(r contract.LateReply) {
		mu.Lock()
		defer mu.Unlock()
		late[r.Request.ID]++
		if r.Err == nil && r.Decision.Allowed {
			lateAllowed++
		}
	}) {
		t.Fatal("OnLate refused with coalescing on")
	}
	p := ratelimit.Policy{Name: "late", Algorithm: ratelimit.SlidingWindowLog, Limit: 100_000, Window: time.Minute}
	if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "warm"}); err != nil {
		t.Fatal(err) // loads the script
	}
	px.LatencyJitter(0, 3*time.Millisecond)
	var (
		callerAllowed, pending atomic.Int64
		pendingIDs             sync.Map
		wg                     sync.WaitGroup
	)
	for g := range 16 {
		wg.Go(func() {
			for i := range 60 {
				id := fmt.Sprintf("r%d-%d", g, i)
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(100+(g*60+i)%30*100)*time.Microsecond)
				d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: id})
				cancel()
				switch {
				case err == nil && d.Allowed:
					callerAllowed.Add(1)
				case errors.Is(err, contract.ErrPending):
					pending.Add(1)
					pendingIDs.Store(id, true)
				case err == nil:
					t.Errorf("%s refused with a limit of 100 000", id)
				case !errors.Is(err, context.DeadlineExceeded):
					t.Errorf("%s: %v", id, err)
				}
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(late)
		mu.Unlock()
		if int64(n) >= pending.Load() || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range late {
		if _, ok := pendingIDs.Load(id); !ok || n != 1 {
			t.Errorf("%s: %d late replies, pending %v: want one, for a call whose caller was told it is pending", id, n, ok)
		}
	}
	if int64(len(late)) != pending.Load() {
		t.Errorf("%d calls pending, %d late replies", pending.Load(), len(late))
	}
	counted, err := srv.Client().ZCard(context.Background(), l.Key(p, "k")).Result()
	if err != nil {
		t.Fatal(err)
	}
	told := callerAllowed.Load() + int64(lateAllowed)
	t.Logf("Redis counted %d; callers were told %d, the late handler %d (%d pending)", counted, callerAllowed.Load(), lateAllowed, pending.Load())
	if counted != told {
		t.Fatalf("Redis counted %d, the callers and the late handler were told %d admissions", counted, told)
	}
	if pending.Load() == 0 || callerAllowed.Load() == 0 {
		t.Fatal("no call was both answered and left pending: the test did not test")
	}
}

// inFlight records the most pipelines a client had in flight at once.
type inFlight struct{ now, most atomic.Int64 }

func (f *inFlight) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (f *inFlight) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return f.around(next) }
func (f *inFlight) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := f.now.Add(1)
		for m := f.most.Load(); n > m && !f.most.CompareAndSwap(m, n); m = f.most.Load() {
		}
		defer f.now.Add(-1)
		return next(ctx, cmds)
	}
}
func (f *inFlight) around(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		n := f.now.Add(1)
		for m := f.most.Load(); n > m && !f.most.CompareAndSwap(m, n); m = f.most.Load() {
		}
		defer f.now.Add(-1)
		return next(ctx, cmd)
	}
}

// TestSlowPipelinesDoNotQueue: with Redis answering in 40 ms, calls that
// find the one pipeline of Coalescing 1 in flight for longer than its
// patience send pipelines of their own, instead of each waiting a second
// round trip (past a 50 ms deadline, every call of a slow Redis timed out).
func TestSlowPipelinesDoNotQueue(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	px := redistest.StartProxy(t, srv.Addr())
	o := srv.Options()
	o.Addr, o.ReadTimeout, o.ContextTimeoutEnabled = px.Addr(), 5*time.Second, true
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	var f inFlight
	c.AddHook(&f)
	// Patience: a tenth of the 100 ms timeout.
	l := redisstore.New(c, redisstore.Config{Coalescing: 1, Timeout: 100 * time.Millisecond})
	p := ratelimit.Policy{Name: "slow", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Second}
	if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "warm"}); err != nil {
		t.Fatal(err)
	}
	px.Latency(40 * time.Millisecond)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: fmt.Sprint("k", i)}); err != nil {
				t.Error(err)
			}
		})
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	if m := f.most.Load(); m < 3 {
		t.Fatalf("at most %d round trips in flight at once: the calls queued behind one slow pipeline", m)
	}
}
