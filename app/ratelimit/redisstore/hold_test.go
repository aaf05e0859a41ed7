package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// TestHoldCountsUnitsFromTheEndOfTheHold: a held GCRA request's units count
// from now + hold (contract.Request.Hold), alone and in a batch; a held
// request refused leaves the key as it was, and one admitted behind a
// theoretical arrival time already past now + hold costs what it would
// without the hold.
func TestHoldCountsUnitsFromTheEndOfTheHold(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{Clock: func() time.Time { return now }})
	// 10 a second: one unit is 100 ms of the 1 s tolerance.
	p := ratelimit.Policy{Name: "hold", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Second}
	held := func(key, id string, cost int64, hold time.Duration) contract.Request {
		return contract.Request{Request: ratelimit.Request{Policy: p, Key: key, ID: id, Cost: cost}, Hold: hold}
	}
	check := func(name string, d contract.Decision, err error, allowed bool, remaining int64, ahead time.Duration) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := time.Duration(d.State.TAT-d.State.Now) * time.Microsecond
		if d.Allowed != allowed || d.Remaining != remaining || got != ahead {
			t.Fatalf("%s: allowed %v, remaining %d, TAT now+%v; want %v, %d, now+%v", name, d.Allowed, d.Remaining, got, allowed, remaining, ahead)
		}
	}
	for _, batch := range []bool{false, true} {
		key := "single"
		decide := func(r contract.Request) (contract.Decision, error) { return l.DecideWire(ctx, r) }
		if batch {
			key = "batch"
			// Beside a request of another key, so that the batch script decides it.
			decide = func(r contract.Request) (contract.Decision, error) {
				ds, errs := l.Ext().DecideWire(ctx, []contract.Request{r, {Request: ratelimit.Request{Policy: p, Key: "other", ID: r.ID + "-other"}}})
				return ds[0], errs[0]
			}
		}
		// An empty key: 3 units from now + 500 ms, 800 ms of the tolerance.
		d, err := decide(held(key, key+"1", 3, 500*time.Millisecond))
		check(key+": first hold", d, err, true, 2, 800*time.Millisecond)
		// 3 more from now + 800 ms would pass the tolerance: refused, unchanged.
		d, err = decide(held(key, key+"2", 3, 500*time.Millisecond))
		check(key+": refused hold", d, err, false, 2, 800*time.Millisecond)
		// Behind now + 800 ms a hold of 500 ms adds nothing.
		d, err = decide(held(key, key+"3", 2, 500*time.Millisecond))
		check(key+": hold behind the TAT", d, err, true, 0, time.Second)
	}
	// Without a hold the same first request costs its units only.
	d, err := l.DecideWire(ctx, held("plain", "p1", 3, 0))
	check("no hold", d, err, true, 7, 300*time.Millisecond)
}

// TestHoldIsOnlyForGCRA: a hold on another algorithm, a read-only request
// or past the window is a bad request.
func TestHoldIsOnlyForGCRA(t *testing.T) {
	for _, r := range []contract.Request{
		{Request: ratelimit.Request{Policy: ratelimit.Policy{Name: "tb", Algorithm: ratelimit.TokenBucket, Limit: 10, Window: time.Second}, Key: "k"}, Hold: time.Millisecond},
		{Request: ratelimit.Request{Policy: ratelimit.Policy{Name: "g", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Second}, Key: "k"}, Hold: 2 * time.Second},
		{Request: ratelimit.Request{Policy: ratelimit.Policy{Name: "g", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Second}, Key: "k"}, Hold: -time.Millisecond},
		{Request: ratelimit.Request{Policy: ratelimit.Policy{Name: "g", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Second}, Key: "k", ReadOnly: true}, Hold: time.Millisecond},
	} {
		if err := r.Validate(); err == nil {
			t.Errorf("%+v: valid", r)
		}
	}
}
