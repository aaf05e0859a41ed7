package redisstore_test

import (
	"context"
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// TestCutoffIsTheFirstRecoveryCall: the fleet's charge cutoff is Redis'
// clock at the first call of a recovery, whichever instance makes it; the
// later calls of the same recovery get that time back, and the first call
// of the next recovery (its outage began after the cutoff) sets a new one.
func TestCutoffIsTheFirstRecoveryCall(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	ctx := context.Background()
	var a, b contract.Cutoff = redisstore.New(newClient(t, srv.Addr()), redisstore.Config{}).Ext(), redisstore.New(newClient(t, srv.Addr()), redisstore.Config{}).Ext()

	first, now, err := a.Cutoff(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if first != now {
		t.Fatalf("the first call's cutoff %d, want Redis' clock at the call, %d", first, now)
	}
	again, later, err := b.Cutoff(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if again != first || later < first {
		t.Fatalf("another instance's call: cutoff %d at %d, want the first's, %d", again, later, first)
	}
	next, nextNow, err := b.Cutoff(ctx, first+1)
	if err != nil {
		t.Fatal(err)
	}
	if next != nextNow || next <= first {
		t.Fatalf("a later outage's first call: cutoff %d at %d, want a new one (the old one is %d)", next, nextNow, first)
	}
}
