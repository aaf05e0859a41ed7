package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
)

// One instance without Redis: a token bucket of 2 refilled at 1 a second,
// on a clock the example moves.
func Example() {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	limiter := memstore.New(memstore.WithCapacity(10_000), memstore.WithClock(func() time.Time { return now }))

	upload := ratelimit.Policy{Name: "upload", Algorithm: ratelimit.TokenBucket, Limit: 1, Window: time.Second, Burst: 2}
	decide := func() {
		d, err := limiter.Decide(context.Background(), ratelimit.Request{Policy: upload, Key: "user-42"})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(d.Allowed, "remaining", d.Remaining, "retry after", d.RetryAfter)
	}
	decide()
	decide()
	decide()
	now = now.Add(time.Second)
	decide()
	// Output:
	// true remaining 1 retry after 0s
	// true remaining 0 retry after 0s
	// false remaining 0 retry after 1s
	// true remaining 0 retry after 0s
}
