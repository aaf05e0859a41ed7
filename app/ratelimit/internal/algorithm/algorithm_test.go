package algorithm_test

import (
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/vectors"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
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

func (w *twin) decide(s vectors.Step) contract.Decision {
	var d contract.Decision
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

func (w *twin) replay(now int64, grants []store.Grant) store.ReplayResult {
	var r store.ReplayResult
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

// TestResendVectors runs the resend table against the pure transitions and
// the at-most-once rule (Admission): a resend decides with a cost of 0 (the
// state refilled to now, nothing taken), as lua/once.lua does.
func TestResendVectors(t *testing.T) {
	for _, c := range vectors.ResendCases {
		t.Run(c.Name, func(t *testing.T) {
			w := &twin{p: c.Policy}
			log := c.Policy.Algorithm == ratelimit.SlidingWindowLog
			var last algorithm.Admission   // the hash's field i
			admitted := map[string]int64{} // the log's members: each id's latest admission
			for i, s := range c.Steps {
				now, cost := vectors.T0+s.At, max(s.Cost, 1)
				resend := last.Resend(s.ID, now, c.Window)
				if log {
					at, ok := admitted[s.ID]
					resend = ok && algorithm.Admission{ID: s.ID, At: at}.Resend(s.ID, now, c.Window)
				}
				step := vectors.Step{At: s.At, Cost: cost}
				if resend {
					step.Cost = 0
				}
				d := w.decide(step)
				if d.Allowed && !resend {
					last = algorithm.Admission{ID: s.ID, At: now}
					admitted[s.ID] = now
				}
				var id string
				var until int64
				if !d.Allowed {
					newest := last
					if log {
						newest = algorithm.Admission{}
						for k, at := range admitted {
							if at > newest.At || at == newest.At && k > newest.ID {
								newest = algorithm.Admission{ID: k, At: at}
							}
						}
					}
					id, until = newest.Hint(now, c.Window)
				}
				want := s
				if want.ResendUntil != 0 {
					want.ResendUntil += vectors.T0
				}
				if d.Allowed != s.Allowed || d.Remaining != s.Remaining || id != want.ResendID || until != want.ResendUntil {
					t.Errorf("step %d (%s at %d): allowed %v, remaining %d, hint %q until %d; want %v, %d, %q until %d",
						i, s.ID, s.At, d.Allowed, d.Remaining, id, until, s.Allowed, s.Remaining, want.ResendID, want.ResendUntil)
				}
			}
		})
	}
}

func TestAdmissionString(t *testing.T) {
	a := algorithm.Admission{ID: "0af3:req-1", At: vectors.T0}
	got, ok := algorithm.ParseAdmission(a.String())
	if !ok || got != a {
		t.Errorf("ParseAdmission(%q) = %+v %v, want %+v", a.String(), got, ok, a)
	}
	for _, bad := range []string{"", "req-1", "x:req-1", ":req-1"} {
		if _, ok := algorithm.ParseAdmission(bad); ok {
			t.Errorf("ParseAdmission(%q) accepted", bad)
		}
	}
}
