package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// The Redis store on its own: every decision one atomic script in Redis, on
// Redis' clock, so any number of instances share the limit. Without the
// resilient layer (package resilient) an error means Redis could not decide,
// and the caller chooses how to fail.
func Example() {
	client, err := redisstore.NewClient(redisstore.ClientConfig{URL: os.Getenv("RL_REDIS_URL"), Timeout: 50 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	backend := redisstore.New(client, redisstore.Config{})

	ctx := context.Background()
	login := ratelimit.Policy{Name: "login", Algorithm: ratelimit.SlidingWindowLog, Limit: 2, Window: time.Minute}
	for range 3 {
		d, err := backend.Decide(ctx, ratelimit.Request{Policy: login, Key: "user-42"})
		if err != nil {
			fmt.Println(err) // fail open or closed: the caller's choice
			return
		}
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter.Round(time.Minute))
	}

	// Lift the limit (the service's POST /admin/reset), then ask without
	// counting.
	if err := backend.Reset(ctx, "user-42", login); err != nil {
		fmt.Println(err)
		return
	}
	d, err := backend.Decide(ctx, ratelimit.Request{Policy: login, Key: "user-42", ReadOnly: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("after the reset:", d.Remaining, "left")
	// Output:
	// true 1 0s
	// true 0 0s
	// false 0 1m0s
	// after the reset: 2 left
}
