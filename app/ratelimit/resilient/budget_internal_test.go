package resilient

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient/internal/journal"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// TestChargesLeaveNoMoreThanTheIdeal: four instances' token bucket and GCRA
// charges, replayed one after another into a store whose bucket refilled
// to full during a 20 s outage, leave it no more tokens than one bucket fed
// every grant in time order holds at the replay. One instance's clients
// left it 5 s before the outage ended: dated at its last grant, its charge
// would be refilled by the store at the whole rate for those 5 s while the
// other shares granted that refill too, leaving the store above the ideal.
func TestChargesLeaveNoMoreThanTheIdeal(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	t0 := int64(1_700_000_000) * sec
	end := t0 + 20*sec
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
			w := p.Window.Microseconds()
			// The store's state when the outage began: the key empty, as
			// the fleet kept it, and the snapshot every instance took of it.
			empty := contract.State{Now: t0, TAT: t0 + w}
			snap := journal.Snapshot{Policy: p, State: empty, Valid: true, N: 4, Confirmed: t0}
			tb := algorithm.TokenBucketState{Tokens: 0, Last: t0}
			gcra := algorithm.GCRAState{TAT: t0 + w}
			decide := func(now, cost int64) contract.Decision {
				var d contract.Decision
				if alg == ratelimit.TokenBucket {
					tb, d = algorithm.TokenBucketDecide(p, tb, now, cost, contract.Weight{})
				} else {
					gcra, d = algorithm.GCRADecide(p, gcra, now, cost, contract.Weight{})
				}
				return d
			}
			// Each share (a quarter: 2.5 tokens/s) granted as it refilled;
			// the first instance's clients stopped at 15 s.
			grants := make([][]store.Grant, 4)
			var all []store.Grant
			for i := range grants {
				last := end
				if i == 0 {
					last = t0 + 15*sec
				}
				for at := t0 + 400_000; at <= last; at += 400_000 {
					grants[i] = append(grants[i], store.Grant{At: at, Cost: 1})
				}
				all = append(all, grants[i]...)
			}
			algorithm.SortGrants(all)
			for _, g := range all {
				if d := decide(g.At, g.Cost); !d.Allowed {
					t.Fatalf("the ideal bucket refused a share's grant at %d µs", g.At-t0)
				}
			}
			ideal := decide(end, 0).Remaining

			tb, gcra = algorithm.TokenBucketState{Tokens: 0, Last: t0}, algorithm.GCRAState{TAT: t0 + w}
			for i := range grants {
				at, units, ok := netOfRefill(p, snap, grants[i], end)
				if !ok {
					t.Fatal("no charge")
				}
				charge := []store.Grant{{At: at, Cost: int64(math.Ceil(units - 1e-9))}}
				if alg == ratelimit.TokenBucket {
					tb, _ = algorithm.TokenBucketReplay(p, tb, end, charge)
				} else {
					gcra, _ = algorithm.GCRAReplay(p, gcra, end, charge)
				}
			}
			got := decide(end, 0).Remaining
			t.Logf("%d grants; after the charges %d tokens left, the ideal bucket %d", len(all), got, ideal)
			if got > ideal {
				t.Errorf("the store holds %d tokens after the charges, more than the %d of one bucket fed every grant", got, ideal)
			}
		})
	}
}

// TestInterleavedSharesReplayInAnyOrder: four instances' grants at exactly
// the rate, interleaved in time (each at a quarter of it), on a key the
// fleet kept saturated when the outage began, are charged one instance
// after another, in every order. The store ends where one limiter fed every
// grant in time order ends (empty: every grant took the unit the refill
// brought), whatever the order: a fold of each instance's grants at their
// own times charged every grant of the second, third and fourth instance a
// full emission interval behind the first's, (N-1)/N of the outage's usage
// twice.
func TestInterleavedSharesReplayInAnyOrder(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	t0 := int64(1_700_000_000) * sec
	end := t0 + 20*sec
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
			w := p.Window.Microseconds()
			snap := journal.Snapshot{Policy: p, State: contract.State{Now: t0, TAT: t0 + w}, Valid: true, N: 4, Confirmed: t0}
			interval := w / p.Limit // one unit refills in this long
			grants := make([][]store.Grant, 4)
			for k := int64(1); t0+k*interval <= end; k++ {
				i := k % 4
				grants[i] = append(grants[i], store.Grant{At: t0 + k*interval, Cost: 1})
			}
			remaining := func(order []int) time.Duration {
				tb, gcra := algorithm.TokenBucketState{Tokens: 0, Last: t0}, algorithm.GCRAState{TAT: t0 + w}
				for _, i := range order {
					at, units, ok := netOfRefill(p, snap, slices.Clone(grants[i]), end)
					if !ok {
						t.Fatal("no charge")
					}
					charge := []store.Grant{{At: at, Cost: int64(math.Ceil(units - 1e-9))}}
					if alg == ratelimit.TokenBucket {
						tb, _ = algorithm.TokenBucketReplay(p, tb, end, charge)
					} else {
						gcra, _ = algorithm.GCRAReplay(p, gcra, end, charge)
					}
				}
				var d contract.Decision
				if alg == ratelimit.TokenBucket {
					_, d = algorithm.TokenBucketDecide(p, tb, end, 1, contract.Weight{})
				} else {
					_, d = algorithm.GCRADecide(p, gcra, end, 1, contract.Weight{})
				}
				return d.RetryAfter
			}
			// The ideal: one bucket, empty at t0, fed every grant in time order.
			tb, gcra := algorithm.TokenBucketState{Tokens: 0, Last: t0}, algorithm.GCRAState{TAT: t0 + w}
			var all []store.Grant
			for _, g := range grants {
				all = append(all, g...)
			}
			algorithm.SortGrants(all)
			var ideal contract.Decision
			for _, g := range append(all, store.Grant{At: end, Cost: 1}) {
				if alg == ratelimit.TokenBucket {
					tb, ideal = algorithm.TokenBucketDecide(p, tb, g.At, g.Cost, contract.Weight{})
				} else {
					gcra, ideal = algorithm.GCRADecide(p, gcra, g.At, g.Cost, contract.Weight{})
				}
			}
			var orders [][]int
			var permute func(prefix, rest []int)
			permute = func(prefix, rest []int) {
				if len(rest) == 0 {
					orders = append(orders, slices.Clone(prefix))
					return
				}
				for j := range rest {
					permute(append(prefix, rest[j]), append(slices.Clone(rest[:j]), rest[j+1:]...))
				}
			}
			permute(nil, []int{0, 1, 2, 3})
			unit := time.Duration(interval) * time.Microsecond
			for _, order := range orders {
				// Charges round up to whole units: at most one per
				// instance more than the ideal.
				if got := remaining(order); got < ideal.RetryAfter || got > ideal.RetryAfter+4*unit {
					t.Errorf("instances replayed in the order %v: the next unit in %v, the ideal's in %v", order, got, ideal.RetryAfter)
				}
			}
		})
	}
}
