package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/mocks"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/lease"
)

// TestRefusedDrawDecidesTheRequestAlone: the first requests of a key go to
// the wrapped limiter as they are; once the key is hot a draw goes instead,
// held for the lease's lifetime and with an id of its own; when the store
// refuses the draw, the request is decided alone, as it came, and that
// decision is its answer; a draw admitted answers the next requests with
// no call.
func TestRefusedDrawDecidesTheRequestAlone(t *testing.T) {
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Second, Lease: 200 * time.Millisecond}
	refuse := true
	var calls []contract.Request
	next := wireFake(func(_ context.Context, req contract.Request) (ratelimit.Decision, error) {
		calls = append(calls, req)
		d := ratelimit.Decision{Allowed: true, Remaining: 900, Limit: 1000, Mode: ratelimit.ModeRedis}
		if req.Cost > 1 && refuse {
			d.Allowed, d.RetryAfter = false, time.Millisecond
		}
		return d, nil
	})
	l := lease.New(next, lease.Config{})
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	decide := func(n int) ratelimit.Decision {
		t.Helper()
		d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: fmt.Sprint("r", n)})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for n := range lease.MinUnits - 1 {
		decide(n)
	}
	for i, c := range calls {
		if c.Cost != 0 || c.Hold != 0 || c.ID != fmt.Sprint("r", i) {
			t.Fatalf("cold call %d: %+v, want the request as it came", i, c)
		}
	}
	calls = nil
	if d := decide(10); !d.Allowed || len(calls) != 2 {
		t.Fatalf("hot, the draw refused: %+v after %d calls, want admitted after a draw and the request alone", d, len(calls))
	}
	if draw, alone := calls[0], calls[1]; draw.Cost <= 1 || draw.Hold != p.Lease || draw.ID == "r10" ||
		alone.Cost != 0 || alone.Hold != 0 || alone.ID != "r10" {
		t.Fatalf("draw %+v, then %+v", draw, alone)
	}
	refuse = false
	calls = nil
	decide(11)
	if len(calls) != 1 || calls[0].Cost <= 1 {
		t.Fatalf("calls %+v, want one draw", calls)
	}
	size := calls[0].Cost
	for n := range size - 1 {
		if d := decide(100 + int(n)); !d.Allowed || d.Mode != ratelimit.ModeRedis {
			t.Fatalf("from the lease: %+v", d)
		}
	}
	if len(calls) != 1 {
		t.Fatalf("%d calls while the lease of %d lasted", len(calls), size)
	}
	if st := l.Stats(); st.Draws != 1 || st.Refused != 1 || st.Served != uint64(size-1) {
		t.Fatalf("stats %+v", st)
	}
}

// TestKeysAreBounded: the table follows at most MaxKeys keys; a key that
// finds it full is decided as it came, and keys idle for two lifetimes
// leave it.
func TestKeysAreBounded(t *testing.T) {
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Second, Lease: 10 * time.Millisecond}
	var calls int
	next := wireFake(func(_ context.Context, req contract.Request) (ratelimit.Decision, error) {
		calls++
		if req.Cost != 0 || req.Hold != 0 {
			t.Errorf("a cold key's request changed: %+v", req)
		}
		return ratelimit.Decision{Allowed: true, Remaining: 900, Mode: ratelimit.ModeRedis}, nil
	})
	l := lease.New(next, lease.Config{MaxKeys: 10, Tick: time.Millisecond})
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	for n := range 50 {
		if d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: fmt.Sprint("k", n)}); err != nil || !d.Allowed {
			t.Fatalf("%d: %+v %v", n, d, err)
		}
	}
	// At most 10 (fewer when a stall let the sweep drop idle ones).
	if st := l.Stats(); st.Keys > 10 || st.Keys == 0 || calls != 50 {
		t.Fatalf("%d keys followed, %d calls; want 1 to 10 and 50", st.Keys, calls)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Keys != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle keys still followed", l.Stats().Keys)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRequestsWaitForTheDrawOut: requests of a hot key that find its lease
// spent while a draw is out wait for the draw and are answered from it,
// instead of each asking the store.
func TestRequestsWaitForTheDrawOut(t *testing.T) {
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Second, Lease: 200 * time.Millisecond}
	release := make(chan struct{})
	var (
		mu           sync.Mutex
		draws, alone int
	)
	next := wireFake(func(_ context.Context, req contract.Request) (ratelimit.Decision, error) {
		if req.Cost > 1 {
			<-release
		}
		mu.Lock()
		if req.Cost > 1 {
			draws++
		} else {
			alone++
		}
		mu.Unlock()
		return ratelimit.Decision{Allowed: true, Remaining: 900, Mode: ratelimit.ModeRedis}, nil
	})
	l := lease.New(next, lease.Config{})
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	decide := func() {
		if d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"}); err != nil || !d.Allowed {
			t.Errorf("%+v %v", d, err)
		}
	}
	for range lease.MinUnits - 1 {
		decide()
	}
	var wg sync.WaitGroup
	wg.Go(decide)                     // the draw, held up in the store
	time.Sleep(20 * time.Millisecond) // the draw is out
	for range 3 {
		wg.Go(decide)
	}
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	if alone != lease.MinUnits-1 || draws < 1 {
		t.Fatalf("%d requests asked the store alone, %d draws; want only the %d cold ones alone", alone, draws, lease.MinUnits-1)
	}
}

// TestOneBatchTwiceTheKey: a batch that asks for one key twice does not
// wait for its own draw.
func TestOneBatchTwiceTheKey(t *testing.T) {
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Second, Lease: 200 * time.Millisecond}
	next := wireFake(func(_ context.Context, req contract.Request) (ratelimit.Decision, error) {
		return ratelimit.Decision{Allowed: true, Remaining: 900, Mode: ratelimit.ModeRedis}, nil
	})
	l := lease.New(next, lease.Config{})
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r := ratelimit.Request{Policy: p, Key: "k"}
	for n := range 4 {
		ds, errs := l.DecideBatch(ctx, []ratelimit.Request{r, r, r})
		for i := range ds {
			if errs[i] != nil || !ds[i].Allowed {
				t.Fatalf("batch %d: %+v %v", n, ds, errs)
			}
		}
	}
	if ctx.Err() != nil {
		t.Fatal("a batch waited for its own draw")
	}
}

// TestPlainLimiterGetsNoLeases: over a limiter that cannot hold units for
// a lease's lifetime (one from outside the module: its requests carry no
// hold), a lease policy's requests all go down as they came, however hot
// the key: no draw.
func TestPlainLimiterGetsNoLeases(t *testing.T) {
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1000, Window: time.Second, Lease: 200 * time.Millisecond}
	var calls []ratelimit.Request
	next := &mocks.Limiter{DecideFunc: func(_ context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
		calls = append(calls, req)
		return ratelimit.Decision{Allowed: true, Remaining: 900, Limit: 1000, Mode: ratelimit.ModeRedis}, nil
	}}
	l := lease.New(next, lease.Config{})
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	n := 10 * lease.MinUnits
	for i := range n {
		if d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k", ID: fmt.Sprint("r", i)}); err != nil || !d.Allowed {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
	}
	if len(calls) != n {
		t.Fatalf("%d calls for %d requests, want one each", len(calls), n)
	}
	for i, c := range calls {
		if c.Cost != 0 || c.ID != fmt.Sprint("r", i) {
			t.Fatalf("call %d: %+v, want the request as it came", i, c)
		}
	}
	if st := l.Stats(); st.Draws != 0 || st.Served != 0 {
		t.Fatalf("stats %+v, want no lease", st)
	}
}
