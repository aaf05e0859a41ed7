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

// bucket is a token bucket or GCRA key's state in the store, driven
// through the Go twins of the scripts.
type bucket struct {
	p    ratelimit.Policy
	t0   int64
	tb   algorithm.TokenBucketState
	gcra algorithm.GCRAState
}

// emptyBucket is p's key as the fleet kept it when an outage began at t0
// (store µs): empty.
func emptyBucket(p ratelimit.Policy, t0 int64) *bucket {
	return &bucket{p: p, t0: t0, tb: algorithm.TokenBucketState{Last: t0}, gcra: algorithm.GCRAState{TAT: t0 + p.Window.Microseconds()}}
}

func (b *bucket) decide(now, cost int64) contract.Decision {
	var d contract.Decision
	if b.p.Algorithm == ratelimit.TokenBucket {
		b.tb, d = algorithm.TokenBucketDecide(b.p, b.tb, now, cost, contract.Weight{})
	} else {
		b.gcra, d = algorithm.GCRADecide(b.p, b.gcra, now, cost, contract.Weight{})
	}
	return d
}

func (b *bucket) replay(now int64, grants ...store.Grant) {
	if b.p.Algorithm == ratelimit.TokenBucket {
		b.tb, _ = algorithm.TokenBucketReplay(b.p, b.tb, now, grants)
	} else {
		b.gcra, _ = algorithm.GCRAReplay(b.p, b.gcra, now, grants)
	}
}

// notAboveTheIdeal checks that b holds no more units at end than one
// bucket, empty at the same t0, that admitted every grant in time order.
func (b *bucket) notAboveTheIdeal(t *testing.T, grants []store.Grant, end int64) {
	t.Helper()
	ideal := emptyBucket(b.p, b.t0)
	sorted := slices.Clone(grants)
	algorithm.SortGrants(sorted)
	for _, g := range sorted {
		if d := ideal.decide(g.At, g.Cost); !d.Allowed {
			t.Fatalf("the ideal bucket refused a share's grant at %d µs", g.At-b.t0)
		}
	}
	want, got := ideal.decide(end, 0).Remaining, b.decide(end, 0).Remaining
	t.Logf("%d grants; after the charges %d units left, the ideal bucket %d", len(grants), got, want)
	if got > want {
		t.Errorf("the store holds %d units after the charges, more than the %d of one bucket fed every grant", got, want)
	}
}

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
			st := emptyBucket(p, t0)
			for i := range grants {
				at, units, ok := netOfRefill(p, snap, grants[i], end)
				if !ok {
					t.Fatal("no charge")
				}
				st.replay(end, store.Grant{At: at, Cost: int64(math.Ceil(units - 1e-9))})
			}
			st.notAboveTheIdeal(t, all, end)
		})
	}
}

// TestChargesAtDifferentTimesLeaveNoMoreThanTheIdeal: four instances
// recover from a 20 s outage one after another, 300 ms apart (an instance
// restarted during the outage probes on a clock of its own), each granting
// from its share until every one has replayed. The store's bucket was full
// until the first charge and refills at the whole rate after it; charged
// net of refill up to their own replays, the later instances' shares,
// full themselves, counted none of that refill, so the grants it paid for
// went uncharged and the store ended above one bucket fed every grant.
// Charged from the fleet's cutoff (the first replay) on, it does not.
func TestChargesAtDifferentTimesLeaveNoMoreThanTheIdeal(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	t0 := int64(1_700_000_000) * sec
	up := t0 + 20*sec
	replays := []int64{up, up + 300_000, up + 600_000, up + 900_000}
	end := replays[len(replays)-1]
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
			w := p.Window.Microseconds()
			snap := journal.Snapshot{Policy: p, State: contract.State{Now: t0, TAT: t0 + w}, Valid: true, N: 4, Confirmed: t0}
			// Each share (a quarter: 2.5 tokens/s) grants as it refills,
			// the instances' grants interleaved, until the last replay.
			grants := make([][]store.Grant, len(replays))
			var all []store.Grant
			for i := range grants {
				for at := t0 + 400_000 + int64(i)*100_000; at <= end; at += 400_000 {
					grants[i] = append(grants[i], store.Grant{At: at, Cost: 1})
				}
				all = append(all, grants[i]...)
			}
			st := emptyBucket(p, t0)
			cut := replays[0] // the fleet's cutoff: the first replay's time
			var second []store.Grant
			for i, r := range replays {
				// The first pass: what the share granted by its replay.
				var first, rest []store.Grant
				for _, g := range grants[i] {
					if g.At <= r {
						first = append(first, g)
					} else {
						rest = append(rest, g)
					}
				}
				at, owed, ok := charge(p, snap, first, cut, 0)
				if !ok {
					t.Fatal("no charge")
				}
				st.replay(r, store.Grant{At: at, Cost: owed})
				// The second, once every instance has replayed: what the
				// share granted while it waited.
				if len(rest) > 0 {
					at, owed, _ = charge(p, snap, rest, cut, r)
					second = append(second, store.Grant{At: at, Cost: owed})
				}
			}
			st.replay(end, second...)
			st.notAboveTheIdeal(t, all, end)
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
				st := emptyBucket(p, t0)
				for _, i := range order {
					at, units, ok := netOfRefill(p, snap, slices.Clone(grants[i]), end)
					if !ok {
						t.Fatal("no charge")
					}
					st.replay(end, store.Grant{At: at, Cost: int64(math.Ceil(units - 1e-9))})
				}
				return st.decide(end, 1).RetryAfter
			}
			// The ideal: one bucket, empty at t0, fed every grant in time order.
			var all []store.Grant
			for _, g := range grants {
				all = append(all, g...)
			}
			algorithm.SortGrants(all)
			idealBucket := emptyBucket(p, t0)
			var ideal contract.Decision
			for _, g := range append(all, store.Grant{At: end, Cost: 1}) {
				ideal = idealBucket.decide(g.At, g.Cost)
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
