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

// slowStore returns a store that reads late replies (OnLate, the service's
// setup) with a 20 ms timeout, its server, and the proxy in between, whose
// replies it has already made come 60 ms late.
func slowStore(t *testing.T) (*redisstore.Store, *redistest.Server, *redistest.Proxy) {
	t.Helper()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	px := redistest.StartProxy(t, srv.Addr())
	const timeout = 20 * time.Millisecond
	client, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{px.Addr()}, Timeout: timeout, PoolSize: 16, LateReplies: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	l := redisstore.New(client, redisstore.Config{Timeout: timeout, Coalescing: 2})
	if !l.Ext().OnLate(2*time.Second, func(contract.LateReply) {}) {
		t.Fatal("OnLate refused with coalescing on")
	}
	if err := l.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	px.Latency(60 * time.Millisecond)
	return l, srv, px
}

// connections returns how many connections the server has accepted.
func connections(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	n, err := redisstore.RedisConnections(context.Background(), srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLateHousekeepingKeepsConnections: behind a Redis slower than the
// timeout, heartbeats and pings time out for their callers, and their
// connections stay open: the replies are read within the late window and
// dropped. go-redis closes a connection whose read timed out, and every
// timed-out call then cost a new connection (its dial and AUTH round trip
// on the slow link, which timed out the next calls in turn).
func TestLateHousekeepingKeepsConnections(t *testing.T) {
	l, srv, px := slowStore(t)
	ctx := context.Background()
	before := connections(t, srv)
	const calls = 30
	for i := range calls {
		var err error
		if i%3 == 0 {
			err = l.Ping(ctx)
		} else {
			_, err = l.Heartbeat(ctx, "app1", time.Second, 10*time.Second)
		}
		if err == nil {
			t.Fatalf("call %d answered within 20 ms through a 60 ms proxy: the test did not test", i)
		}
	}
	px.ClearToxics()
	// The last calls' replies are read, and their connections free again.
	time.Sleep(200 * time.Millisecond)
	if _, err := l.Heartbeat(ctx, "app1", time.Second, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// A call lingers 60 ms past its 20 ms deadline: a few at once, each
	// on a connection of its own; one per call if timed-out reads closed
	// their connections.
	if opened := connections(t, srv) - before; opened > 8 {
		t.Fatalf("%d connections opened for %d timed-out calls: want the lingering few", opened, calls)
	}
}

// TestRefundTakesItsCallersDeadline: a refund behind a Redis slower than
// the store's timeout is applied and known to be, within its caller's
// deadline: nobody waits on a refund, and one cut off at the timeout is
// lost (it may have been applied, so it is not sent again), leaving the
// client charged for a request it was refused.
func TestRefundTakesItsCallersDeadline(t *testing.T) {
	l, _, px := slowStore(t)
	px.ClearToxics()
	ctx := context.Background()
	p := ratelimit.Policy{Name: "refund-slow", Algorithm: ratelimit.SlidingWindowLog, Limit: 10, Window: time.Hour}
	d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: "r1"})
	if err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	px.Latency(60 * time.Millisecond)
	callCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	n, err := l.Ext().Refund(callCtx, contract.Request{Request: ratelimit.Request{Policy: p, Key: "k", ID: "r1"}}, contract.Decision{Decision: d})
	if err != nil || n != 1 {
		t.Fatalf("refund through a 60 ms proxy with a second to spare: %d back, %v; want 1", n, err)
	}
}
