package ratelimit_test

import (
	"math"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// NaN and infinities fail validation: a NaN fallback factor would make every
// local share NaN and refuse every request.
func TestPolicyRejectsNaN(t *testing.T) {
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -0.5, 1.5} {
		p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Minute, FallbackFactor: f}
		if err := p.Validate(); err == nil {
			t.Errorf("fallback factor %v: valid, want an error", f)
		}
	}
}

// TestLeaseBounds: a lease is for GCRA only, from 1 ms to a quarter of the
// time the capacity takes to refill (leaseMax), and shapes no stored state
// (the fingerprint ignores it).
func TestLeaseBounds(t *testing.T) {
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 100, Window: 10 * time.Second, Burst: 50}
	if got := ratelimit.LeaseMax(p); got != 1250*time.Millisecond {
		t.Fatalf("leaseMax %v, want 1.25s (50 units at 10/s, a quarter)", got)
	}
	for _, c := range []struct {
		alg   ratelimit.Algorithm
		lease time.Duration
		ok    bool
	}{
		{ratelimit.GCRA, 0, true},
		{ratelimit.GCRA, time.Millisecond, true},
		{ratelimit.GCRA, 1250 * time.Millisecond, true},
		{ratelimit.GCRA, 1251 * time.Millisecond, false},
		{ratelimit.GCRA, time.Microsecond, false},
		{ratelimit.GCRA, -time.Second, false},
		{ratelimit.TokenBucket, time.Second, false},
		{ratelimit.SlidingWindowLog, time.Second, false},
	} {
		q := p
		q.Algorithm, q.Lease = c.alg, c.lease
		if err := q.Validate(); (err == nil) != c.ok {
			t.Errorf("%s lease %v: %v, want valid %v", c.alg, c.lease, err, c.ok)
		}
	}
}
