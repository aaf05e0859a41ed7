package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/budget"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/lease"
)

// fakeStore (what the lease layer consumes: a ratelimit.Limiter that
// decides requests with their holds, contract.Decider) decides every
// request as the store would with room to spare, except the draws
// (requests with a Hold), which draw decides.
type fakeStore struct {
	mu    sync.Mutex
	draws []contract.Request
	draw  func(contract.Request) ratelimit.Decision
}

func (f *fakeStore) Decide(ctx context.Context, r ratelimit.Request) (ratelimit.Decision, error) {
	return f.decide(ctx, contract.Request{Request: r})
}

func (f *fakeStore) DecideWire(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	return wireFake(f.decide).DecideWire(ctx, reqs)
}

func (f *fakeStore) decide(_ context.Context, r contract.Request) (ratelimit.Decision, error) {
	if r.Hold > 0 {
		f.mu.Lock()
		f.draws = append(f.draws, r)
		f.mu.Unlock()
		return f.draw(r), nil
	}
	return ratelimit.Decision{Allowed: true, Limit: r.Policy.Capacity(), Remaining: 10_000, Mode: ratelimit.ModeRedis}, nil
}

// wireFake adapts a function to what the lease layer draws through: a
// limiter whose requests carry their hold (contract.Decider).
type wireFake func(context.Context, contract.Request) (ratelimit.Decision, error)

func (f wireFake) Decide(ctx context.Context, r ratelimit.Request) (ratelimit.Decision, error) {
	return f(ctx, contract.Request{Request: r})
}

func (f wireFake) DecideWire(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	ds, errs := make([]contract.Decision, len(reqs)), make([]error, len(reqs))
	for i, r := range reqs {
		ds[i].Decision, errs[i] = f(ctx, r)
	}
	return ds, errs
}

func (f *fakeStore) drawn() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.draws)
}

var fakePolicy = ratelimit.Policy{Name: "fake", Algorithm: ratelimit.GCRA, Limit: 100_000, Window: time.Hour, Lease: 10 * time.Minute}

// TestDrawNotDecidedInTheStoreIsNotRetried: a draw that the store did not
// decide (the limiter below granted it locally: a timeout with the breaker
// still closed) is not sent again by every request that follows: they go
// at their own cost for a lease's lifetime.
func TestDrawNotDecidedInTheStoreIsNotRetried(t *testing.T) {
	f := &fakeStore{draw: func(r contract.Request) ratelimit.Decision {
		return ratelimit.Decision{Allowed: true, Limit: r.Policy.Capacity(), Mode: ratelimit.ModeLocal}
	}}
	l := lease.New(f, lease.Config{Instance: "app1"})
	defer l.Close(context.Background())
	ctx := context.Background()
	for n := range 50 {
		d, err := l.Decide(ctx, ratelimit.Request{Policy: fakePolicy, Key: "k", ID: fmt.Sprint(n)})
		if err != nil || !d.Allowed {
			t.Fatalf("request %d: %+v %v", n, d, err)
		}
	}
	if n := f.drawn(); n != 1 {
		t.Fatalf("%d draws sent in 50 requests; want 1: after one not decided in the store, requests go at their own cost", n)
	}
}

// TestDrawOutDuringAReloadServesNothing: a draw sent under a policy that is
// reloaded with other parameters while the draw is out installs no lease
// for the new one: the next request of the new policy is not served from
// it.
func TestDrawOutDuringAReloadServesNothing(t *testing.T) {
	release := make(chan struct{})
	f := &fakeStore{draw: func(r contract.Request) ratelimit.Decision {
		<-release
		return ratelimit.Decision{Allowed: true, Limit: r.Policy.Capacity(), Remaining: 5000, Mode: ratelimit.ModeRedis}
	}}
	l := lease.New(f, lease.Config{Instance: "app1"})
	defer l.Close(context.Background())
	ctx := context.Background()
	drawDone := turnHot(t, l, f)
	reloaded := fakePolicy
	reloaded.Limit = 50_000
	// Meets the entry of the old policy (its draw still out) and starts it
	// over; decided at its own cost (no draw while one is out).
	if _, err := l.Decide(ctx, ratelimit.Request{Policy: reloaded, Key: "k", ID: "new-0"}); err != nil {
		t.Fatal(err)
	}
	close(release)
	<-drawDone
	served := l.Stats().Served
	if _, err := l.Decide(ctx, ratelimit.Request{Policy: reloaded, Key: "k", ID: "new-1"}); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Served != served || st.Units != 0 {
		t.Fatalf("after the reload: %+v; want nothing served from, nor held of, the old policy's draw", st)
	}
}

// TestWaitForADrawIsBounded: a request that finds its key's draw out waits
// for it no longer than the Timeout, and what it asks the limiter below
// carries the deadline of its one Timeout in all.
func TestWaitForADrawIsBounded(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	f := &fakeStore{draw: func(r contract.Request) ratelimit.Decision {
		<-release // a store that does not answer the draw
		return ratelimit.Decision{Mode: ratelimit.ModeLocal}
	}}
	const timeout = 50 * time.Millisecond
	l := lease.New(deadlines{f, t}, lease.Config{Instance: "app1", Timeout: timeout})
	defer l.Close(context.Background())
	ctx := context.Background()
	turnHot(t, l, f)
	done := make(chan error, 1)
	go func() {
		_, err := l.Decide(ctx, ratelimit.Request{Policy: fakePolicy, Key: "k", ID: "waiter"})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second): // the bound is 50 ms; before, it waited for the draw
		t.Fatal("the request waited for the draw out past its timeout")
	}
}

// deadlines checks that every request it passes on carries a deadline at
// most the lease layer's Timeout from now.
type deadlines struct {
	next ratelimit.Limiter
	t    *testing.T
}

func (d deadlines) Decide(ctx context.Context, r ratelimit.Request) (ratelimit.Decision, error) {
	if dl, ok := budget.Deadline(ctx); !ok || time.Until(dl) > 50*time.Millisecond {
		d.t.Errorf("request %s passed on without its deadline (%v %v)", r.ID, dl, ok)
	}
	return d.next.Decide(ctx, r)
}

func (d deadlines) DecideWire(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	for _, r := range reqs {
		if dl, ok := budget.Deadline(ctx); !ok || time.Until(dl) > 50*time.Millisecond {
			d.t.Errorf("request %s passed on without its deadline (%v %v)", r.ID, dl, ok)
		}
	}
	return d.next.(contract.Decider).DecideWire(ctx, reqs)
}

// turnHot sends requests of key k until one of them draws (the fake's draw
// then decides when it answers), and returns a channel closed once they
// are all answered.
func turnHot(t *testing.T, l *lease.Limiter, f *fakeStore) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := range 2 * lease.MinUnits {
			_, _ = l.Decide(context.Background(), ratelimit.Request{Policy: fakePolicy, Key: "k", ID: fmt.Sprint(n)})
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for f.drawn() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no draw sent")
		}
		time.Sleep(time.Millisecond)
	}
	return done
}
