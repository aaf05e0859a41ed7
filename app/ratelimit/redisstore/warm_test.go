package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
)

// TestWarm: the client keeps no idle connections warm on its own, so a
// start opens them ahead of the first decisions; without that, a fleet
// starting on a loaded machine decides many of its first requests locally,
// each waiting for a dial. It never holds the whole pool: a Warm larger
// than the pool would hold every connection and make the next call (a
// heartbeat) wait out the pool timeout.
func TestWarm(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	for _, c := range []struct{ pool, want int }{{16, 8}, {4, 2}} {
		client, err := NewClient(ClientConfig{Addrs: []string{srv.Addr()}, Timeout: 50 * time.Millisecond, PoolSize: c.pool})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.Close() })
		New(client, Config{}).warm(context.Background(), 8)
		if st := client.PoolStats(); int(st.TotalConns) != c.want || st.Timeouts != 0 {
			t.Errorf("pool %d, Warm(8): %d connections, %d pool timeouts; want %d and none", c.pool, st.TotalConns, st.Timeouts, c.want)
		}
	}
}
