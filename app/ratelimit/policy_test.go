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
