package lease_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/lease"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// Lease mode over the fleet's limiter. A key of a lease policy, once hot
// (four units asked within a lease's lifetime at this instance), draws a
// lease of units from Redis through the resilient limiter, held for the
// lease's lifetime, and its next requests are answered from the lease
// without a call. Close gives back what is left. Over any other limiter
// the lease layer takes no lease: every request goes down as it came.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: os.Getenv("RL_REDIS_ADDR")})
	defer client.Close()
	res, err := resilient.New(redisstore.New(client, redisstore.Config{}), resilient.Config{Instance: "api-1", JournalDir: os.Getenv("RL_JOURNAL_DIR")})
	if err != nil {
		log.Fatal(err)
	}
	limiter := lease.New(res, lease.Config{Instance: "api-1", Timeout: 50 * time.Millisecond})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = limiter.Close(ctx) // first: gives the leases back through res
		_ = res.Close(ctx)
	}()

	hot := ratelimit.Policy{Name: "search", Algorithm: ratelimit.GCRA, Limit: 1000, Window: 10 * time.Second, Lease: time.Second}
	admitted := 0
	for range 20 {
		d, err := limiter.Decide(context.Background(), ratelimit.Request{Policy: hot, Key: "user-42"})
		if err != nil {
			log.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	fmt.Println("admitted", admitted, "answered from leases:", limiter.Stats().Served)
}
