package invariant

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/fleetlimit/fleetlimit/chaos/ideal"
)

// bruteForce is the definition itself, over every subset of a small log:
// per phase, the largest admitted subset that is certain (valid) and whose
// latest t_recv falls in the phase.
func bruteForce(reqs []Request, valid func(sub []Request) bool) []int {
	ps := spans(testPhases)
	best := make([]int, len(ps))
	for mask := uint(1); mask < 1<<len(reqs); mask++ {
		var sub []Request
		for i := range reqs {
			if mask&(1<<i) != 0 {
				sub = append(sub, reqs[i])
			}
		}
		if !valid(sub) {
			continue
		}
		last := int64(math.MinInt64)
		for _, r := range sub {
			last = max(last, recvUS(r))
		}
		if k := phaseOf(ps, last); k >= 0 {
			best[k] = max(best[k], bits.OnesCount(mask))
		}
	}
	return best
}

func span(sub []Request) (minSend, maxRecv int64) {
	minSend, maxRecv = math.MaxInt64, math.MinInt64
	for _, r := range sub {
		minSend, maxRecv = min(minSend, sendUS(r)), max(maxRecv, recvUS(r))
	}
	return minSend, maxRecv
}

func randomLog(rng *rand.Rand, n int) []Request {
	var reqs []Request
	for range n {
		s := float64(rng.IntN(30_000)) + 5_000 // 5 s to 35 s: warmup to fault
		lat := float64(rng.IntN(3_000))
		if rng.IntN(3) == 0 {
			lat = float64(rng.IntN(20))
		}
		reqs = append(reqs, rq("k", s, s+lat, 200))
	}
	return reqs
}

func TestOverAdmissionAgainstBruteForce(t *testing.T) {
	const w = int64(10_000_000)
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := range 300 {
		reqs := randomLog(rng, 1+rng.IntN(10))
		for _, tc := range []struct {
			alg   string
			valid func([]Request) bool
		}{
			{ideal.SlidingWindowLog, func(sub []Request) bool {
				lo, hi := span(sub)
				return hi-lo < w
			}},
			{ideal.SlidingWindowCounter, func(sub []Request) bool {
				lo, hi := span(sub)
				k := floorDiv(lo, w)
				return hi < (k+1)*w
			}},
		} {
			want := bruteForce(reqs, tc.valid)
			got, err := KeyOverAdmission(pol(tc.alg, 1), reqs, testPhases)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				g := got[i]
				if math.IsNaN(g) {
					g = 0
				}
				if g != float64(want[i]) {
					t.Fatalf("trial %d, %s, phase %s: got %v, brute force %d; log %+v", trial, tc.alg, testPhases[i].Name, got[i], want[i], reqs)
				}
			}
		}
	}
}
