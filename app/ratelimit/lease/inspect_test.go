package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/lease"
)

// TestInspectCountsNothing: Inspect shows the lease a hot key holds (its
// units and end), the same however often it is called, and the units a
// request then takes from it; no lease for a cold or unknown key, nor once
// the lease has ended; and inspecting a key adds it to nothing.
func TestInspectCountsNothing(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := &fakeStore{draw: func(r contract.Request) ratelimit.Decision {
		return ratelimit.Decision{Allowed: true, Limit: r.Policy.Capacity(), Remaining: 10_000, Mode: ratelimit.ModeRedis}
	}}
	l := lease.New(f, lease.Config{Instance: "app1", Now: clock, Tick: time.Hour})
	defer l.Close(context.Background())
	ctx := context.Background()
	if _, _, ok := l.Inspect(fakePolicy.Name, "k"); ok {
		t.Fatal("a lease before any request")
	}
	n := 0
	for ; f.drawn() == 0 && n < 4*lease.MinUnits; n++ {
		if _, err := l.Decide(ctx, ratelimit.Request{Policy: fakePolicy, Key: "k", ID: fmt.Sprint(n)}); err != nil {
			t.Fatal(err)
		}
	}
	if f.drawn() != 1 {
		t.Fatalf("%d draws after %d requests, want 1", f.drawn(), n)
	}
	units, until, ok := l.Inspect(fakePolicy.Name, "k")
	if !ok || units <= 0 || !until.Equal(now.Add(fakePolicy.Lease)) {
		t.Fatalf("Inspect after the draw: %d units until %v %v, want units until %v", units, until, ok, now.Add(fakePolicy.Lease))
	}
	before := l.Stats()
	for range 20 {
		if u, t2, _ := l.Inspect(fakePolicy.Name, "k"); u != units || !t2.Equal(until) {
			t.Fatalf("Inspect changed the lease: %d until %v, then %d until %v", units, until, u, t2)
		}
		_, _, _ = l.Inspect(fakePolicy.Name, "unknown")
		_, _, _ = l.Inspect("other-policy", "k")
	}
	if after := l.Stats(); after != before {
		t.Fatalf("Inspect changed the stats: %+v, then %+v", before, after)
	}
	if _, err := l.Decide(ctx, ratelimit.Request{Policy: fakePolicy, Key: "k", ID: "served"}); err != nil {
		t.Fatal(err)
	}
	if got, _, ok := l.Inspect(fakePolicy.Name, "k"); !ok || got != units-1 {
		t.Fatalf("after one request from the lease: %d %v, want %d units", got, ok, units-1)
	}
	if _, _, ok := l.Inspect(fakePolicy.Name, "unknown"); ok {
		t.Fatal("a lease for a key never asked")
	}
	mu.Lock()
	now = now.Add(fakePolicy.Lease)
	mu.Unlock()
	if u, _, ok := l.Inspect(fakePolicy.Name, "k"); ok {
		t.Fatalf("a lease past its end: %d units", u)
	}
}
