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

// TestReplayVectors runs the replay table against the pure transitions.
func TestReplayVectors(t *testing.T) {
	for _, c := range vectors.ReplayCases {
		t.Run(c.Name, func(t *testing.T) {
			var (
				tb  ratelimit.TokenBucketState
				gc  ratelimit.GCRAState
				wc  ratelimit.WindowCounterState
				log ratelimit.WindowLog
			)
			step := func(s vectors.Step) ratelimit.Decision {
				var d ratelimit.Decision
				now := vectors.T0 + s.At
				switch c.Policy.Algorithm {
				case ratelimit.TokenBucket:
					tb, d = ratelimit.TokenBucketDecide(c.Policy, tb, now, s.Cost, s.Weight)
				case ratelimit.GCRA:
					gc, d = ratelimit.GCRADecide(c.Policy, gc, now, s.Cost, s.Weight)
				case ratelimit.SlidingWindowCounter:
					wc, d = ratelimit.WindowCounterDecide(c.Policy, wc, now, s.Cost, s.Weight)
				case ratelimit.SlidingWindowLog:
					d = ratelimit.WindowLogDecide(c.Policy, &log, now, s.Cost, s.Weight)
				}
				return d
			}
			for _, s := range c.Before {
				step(s)
			}
			now, grants := vectors.T0+c.At, c.AbsGrants()
			var r ratelimit.ReplayResult
			switch c.Policy.Algorithm {
			case ratelimit.TokenBucket:
				tb, r = ratelimit.TokenBucketReplay(c.Policy, tb, now, grants)
			case ratelimit.GCRA:
				gc, r = ratelimit.GCRAReplay(c.Policy, gc, now, grants)
			case ratelimit.SlidingWindowCounter:
				wc, r = ratelimit.WindowCounterReplay(c.Policy, wc, now, grants)
			case ratelimit.SlidingWindowLog:
				r = ratelimit.WindowLogReplay(c.Policy, &log, now, grants)
			}
			if r != c.Result {
				t.Errorf("replay: %+v, want %+v", r, c.Result)
			}
			for i, s := range c.After {
				if got, want := step(s), c.Decision(s); got != want {
					t.Errorf("after step %d:\n got %+v\nwant %+v", i, got, want)
				}
			}
		})
	}
}
