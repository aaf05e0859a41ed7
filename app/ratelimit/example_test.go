package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
)

// The model in a few names: a Policy (an algorithm, a limit per window), a
// Request (the policy, the client's key, its cost) and the Decision a
// Limiter makes of it. Every backend is a Limiter: memstore for one
// instance, resilient over redisstore for a fleet.
func Example() {
	var limiter ratelimit.Limiter = memstore.New(memstore.Config{})
	login := ratelimit.Policy{Name: "login", Algorithm: ratelimit.SlidingWindowLog, Limit: 3, Window: time.Minute}
	if err := login.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	for range 4 {
		d, err := limiter.Decide(context.Background(), ratelimit.Request{Policy: login, Key: "ip:198.51.100.7"})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(d.Allowed, d.Remaining, d.Mode)
	}
	// Output:
	// true 2 memory
	// true 1 memory
	// true 0 memory
	// false 0 memory
}
