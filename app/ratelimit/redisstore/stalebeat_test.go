package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// TestLateBeatIsNotABeat: a heartbeat that reaches Redis after its caller
// gave up on it (a partition that dropped packets heals, and the kernel
// retransmits what the timed-out call had sent) does not mark its instance
// live again: the others go on holding its share back. Counted, the late
// beat would make the instance, still deciding locally with its grants not
// replayed, live to the fleet, and the others would stop holding its share
// back.
func TestLateBeatIsNotABeat(t *testing.T) {
	const ttl, grace = time.Second, 10 * time.Second
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	proxy := redistest.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	cut := redisstore.New(c, redisstore.Config{Timeout: 50 * time.Millisecond})
	other := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{})
	ctx := context.Background()

	if _, err := cut.Heartbeat(ctx, "app1", ttl, grace); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 100*time.Millisecond) // app1's beats stop: it is missing
	proxy.RequestLatency(300 * time.Millisecond)
	if _, err := cut.Heartbeat(ctx, "app1", ttl, grace); err == nil {
		t.Fatal("the delayed heartbeat succeeded; want its caller to give up after 50 ms")
	}
	time.Sleep(500 * time.Millisecond) // the beat has reached Redis and run
	f, err := other.Heartbeat(ctx, "app2", ttl, grace)
	if err != nil {
		t.Fatal(err)
	}
	if f.Live != 1 || f.Suspect != 1 {
		t.Fatalf("live %d, suspect %d; want app2 live and app1 suspect: a beat its caller had given up on counted", f.Live, f.Suspect)
	}
	proxy.ClearToxics()
	if _, err := cut.Heartbeat(ctx, "app1", ttl, grace); err != nil {
		t.Fatal(err)
	}
	if f, err = other.Heartbeat(ctx, "app2", ttl, grace); err != nil || f.Live != 2 {
		t.Fatalf("after a beat in time: %+v %v, want 2 live", f, err)
	}
}
