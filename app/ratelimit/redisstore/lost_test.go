package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// TestOverlappingFleetCallsAreNotLostWrites: an instance's heartbeat and its
// suspension overlap, and the heartbeat's reply, which Redis sent first,
// arrives last, with the lower write counter. That is the order of the
// replies, not writes Redis lost: the generation stays, and nothing is
// raised.
func TestOverlappingFleetCallsAreNotLostWrites(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	px := redistest.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	l := redisstore.New(c, redisstore.Config{Timeout: 5 * time.Second})
	ctx := context.Background()
	f, err := l.Heartbeat(ctx, "app1", time.Second, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	px.Latency(300 * time.Millisecond)
	var wg sync.WaitGroup
	var beatErr error
	wg.Go(func() { _, beatErr = l.Heartbeat(ctx, "app1", time.Second, 10*time.Second) })
	time.Sleep(100 * time.Millisecond) // its reply waits in the proxy
	px.Latency(0)
	if err := l.Ext().Suspend(ctx, "app1", time.Second, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if beatErr != nil {
		t.Fatal(beatErr)
	}
	gen, err := l.Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Ext().LostWrites() != 0 || gen != f.Generation {
		t.Fatalf("%d lost writes seen, generation %q (was %q): replies out of order read as lost writes", l.Ext().LostWrites(), gen, f.Generation)
	}
}
