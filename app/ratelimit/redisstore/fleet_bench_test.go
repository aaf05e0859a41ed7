package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// BenchmarkHeartbeat is one instance's heartbeat (every 100 ms in
// production), which since the lost-writes detection also increments the
// write counter: the cost of the detection on the healthy path (decisions
// are unchanged).
func BenchmarkHeartbeat(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	l := redisstore.New(newClient(b, srv.Addr()), redisstore.Config{})
	ctx := context.Background()
	for b.Loop() {
		if _, err := l.Heartbeat(ctx, "bench", time.Second, 10*time.Second); err != nil {
			b.Fatal(err)
		}
	}
}
