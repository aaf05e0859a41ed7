package lease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/lease"
)

// A key of a lease policy, once hot (four units asked within a lease's
// lifetime), draws a lease of units from the limiter below (in a fleet,
// the resilient limiter over Redis; here a stand-in that admits and counts
// its calls), and its next requests are answered from the lease without a
// call. Close gives back what is left.
func Example() {
	calls, used := 0, int64(0)
	below := limiterFunc(func(_ context.Context, r ratelimit.Request) (ratelimit.Decision, error) {
		calls++
		used += r.Units()
		return ratelimit.Decision{Allowed: true, Limit: r.Policy.Capacity(), Remaining: r.Policy.Capacity() - used, Mode: ratelimit.ModeRedis}, nil
	})
	limiter := lease.New(below, lease.Config{Instance: "api-1"})
	hot := ratelimit.Policy{Name: "search", Algorithm: ratelimit.GCRA, Limit: 1000, Window: 10 * time.Second, Lease: time.Second}
	admitted := 0
	for range 20 {
		d, err := limiter.Decide(context.Background(), ratelimit.Request{Policy: hot, Key: "user-42"})
		if err != nil {
			fmt.Println(err)
			return
		}
		if d.Allowed {
			admitted++
		}
	}
	st := limiter.Stats()
	fmt.Println("admitted", admitted, "in", calls, "calls; answered from leases:", st.Served)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := limiter.Close(ctx); err != nil {
		fmt.Println(err)
	}
	// Output:
	// admitted 20 in 6 calls; answered from leases: 14
}

// limiterFunc adapts a function to ratelimit.Limiter.
type limiterFunc func(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error)

func (f limiterFunc) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	return f(ctx, req)
}
