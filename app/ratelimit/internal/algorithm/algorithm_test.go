package algorithm_test

import (
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/vectors"
)

// twin holds one key's state for every algorithm and applies the pure
// transitions of the policy's algorithm to it.
type twin struct {
	p   ratelimit.Policy
	tb  algorithm.TokenBucketState
	gc  algorithm.GCRAState
	wc  algorithm.WindowCounterState
	log algorithm.WindowLog
}

func (w *twin) decide(s vectors.Step) ratelimit.Decision {
	var d ratelimit.Decision
	now := vectors.T0 + s.At
	switch w.p.Algorithm {
	case ratelimit.TokenBucket:
		w.tb, d = algorithm.TokenBucketDecide(w.p, w.tb, now, s.Cost, s.Weight)
	case ratelimit.GCRA:
		w.gc, d = algorithm.GCRADecide(w.p, w.gc, now, s.Cost, s.Weight)
	case ratelimit.SlidingWindowCounter:
		w.wc, d = algorithm.WindowCounterDecide(w.p, w.wc, now, s.Cost, s.Weight)
	case ratelimit.SlidingWindowLog:
		d = algorithm.WindowLogDecide(w.p, &w.log, now, s.Cost, s.Weight)
	}
	return d
}

func (w *twin) replay(now int64, grants []ratelimit.Grant) ratelimit.ReplayResult {
	var r ratelimit.ReplayResult
	switch w.p.Algorithm {
	case ratelimit.TokenBucket:
		w.tb, r = algorithm.TokenBucketReplay(w.p, w.tb, now, grants)
	case ratelimit.GCRA:
		w.gc, r = algorithm.GCRAReplay(w.p, w.gc, now, grants)
	case ratelimit.SlidingWindowCounter:
		w.wc, r = algorithm.WindowCounterReplay(w.p, w.wc, now, grants)
	case ratelimit.SlidingWindowLog:
		r = algorithm.WindowLogReplay(w.p, &w.log, now, grants)
	}
	return r
}

// TestVectors runs the shared vector table against the pure transitions.
func TestVectors(t *testing.T) {
	for _, c := range vectors.All() {
		t.Run(c.Name, func(t *testing.T) {
			if err := c.Policy.Validate(); err != nil {
				t.Fatal(err)
			}
			w := &twin{p: c.Policy}
			for i, s := range c.Steps {
				if got, want := w.decide(s), c.Decision(s); got != want {
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
			w := &twin{p: c.Policy}
			for _, s := range c.Before {
				w.decide(s)
			}
			if r := w.replay(vectors.T0+c.At, c.AbsGrants()); r != c.Result {
				t.Errorf("replay: %+v, want %+v", r, c.Result)
			}
			for i, s := range c.After {
				if got, want := w.decide(s), c.Decision(s); got != want {
					t.Errorf("after step %d:\n got %+v\nwant %+v", i, got, want)
				}
			}
		})
	}
}
