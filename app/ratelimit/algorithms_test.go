package ratelimit_test

import (
	"testing"

	"github.com/fleetlimit/fleetlimit/app/internal/vectors"
	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// TestVectors runs the shared vector table against the pure transitions.
func TestVectors(t *testing.T) {
	for _, c := range vectors.Cases {
		t.Run(c.Name, func(t *testing.T) {
			if err := c.Policy.Validate(); err != nil {
				t.Fatal(err)
			}
			var (
				tb  ratelimit.TokenBucketState
				gc  ratelimit.GCRAState
				wc  ratelimit.WindowCounterState
				log ratelimit.WindowLog
			)
			for i, s := range c.Steps {
				now := vectors.T0 + s.At
				var got ratelimit.Decision
				switch c.Policy.Algorithm {
				case ratelimit.TokenBucket:
					tb, got = ratelimit.TokenBucketDecide(c.Policy, tb, now, s.Cost, s.Weight)
				case ratelimit.GCRA:
					gc, got = ratelimit.GCRADecide(c.Policy, gc, now, s.Cost, s.Weight)
				case ratelimit.SlidingWindowCounter:
					wc, got = ratelimit.WindowCounterDecide(c.Policy, wc, now, s.Cost, s.Weight)
				case ratelimit.SlidingWindowLog:
					got = ratelimit.WindowLogDecide(c.Policy, &log, now, s.Cost, s.Weight)
				}
				if want := c.Decision(s); got != want {
					t.Errorf("step %d (t=%d cost=%d):\n got %+v\nwant %+v", i, s.At, s.Cost, got, want)
				}
			}
		})
	}
}
