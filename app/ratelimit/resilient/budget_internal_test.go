package resilient

import (
	"math"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/journal"
)

// TestChargesLeaveNoMoreThanTheIdeal: four instances' token bucket and GCRA
// charges, replayed one after another into a store whose bucket refilled
// to full during a 20 s outage, leave it no more tokens than one bucket fed
// every grant in time order holds at the replay. One instance's clients
// left it 5 s before the outage ended: dated at its last grant, its charge
// was refilled by the store at the whole rate for those 5 s while the other
// shares granted that refill too (25 tokens left where the ideal held 13).
func TestChargesLeaveNoMoreThanTheIdeal(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	t0 := int64(1_700_000_000) * sec
	end := t0 + 20*sec
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
			w := p.WindowMicros()
			// The store's state when the outage began: the key empty, as
			// the fleet kept it, and the snapshot every instance took of it.
			empty := ratelimit.State{Now: t0, TAT: t0 + w}
			snap := journal.Snapshot{Policy: p, State: empty, Valid: true, N: 4, Confirmed: t0}
			tb := algorithm.TokenBucketState{Tokens: 0, Last: t0}
			gcra := algorithm.GCRAState{TAT: t0 + w}
			decide := func(now, cost int64) ratelimit.Decision {
				var d ratelimit.Decision
				if alg == ratelimit.TokenBucket {
					tb, d = algorithm.TokenBucketDecide(p, tb, now, cost, ratelimit.Weight{})
				} else {
					gcra, d = algorithm.GCRADecide(p, gcra, now, cost, ratelimit.Weight{})
				}
				return d
			}
			// Each share (a quarter: 2.5 tokens/s) granted as it refilled;
			// the first instance's clients stopped at 15 s.
			grants := make([][]ratelimit.Grant, 4)
			var all []ratelimit.Grant
			for i := range grants {
				last := end
				if i == 0 {
					last = t0 + 15*sec
				}
				for at := t0 + 400_000; at <= last; at += 400_000 {
					grants[i] = append(grants[i], ratelimit.Grant{At: at, Cost: 1})
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
				charge := []ratelimit.Grant{{At: at, Cost: int64(math.Ceil(units - 1e-9))}}
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

// TestWindowLogShareHoldsPlacesRetakenBeforeConfirmation: a sliding window
// log key whose oldest age bucket straddles the time the other instances
// hold this one's share back (confirmed). The places of that bucket that
// freed before then may have been taken again in the store by the others (an
// abusive key takes every place the moment it frees), for a window from
// then. Four instances whose snapshots show the same log grant locally as
// their shares allow; the store's log, the places retaken in it and every
// local grant together must never exceed the limit in any window. Counted
// free at the bucket's latest expiry, the shares granted 72 places of which
// 37 had been retaken: 137 in a window of 100 (native shard-wipe: sliding
// window log over-admission 1.01-1.16 in fault).
func TestWindowLogShareHoldsPlacesRetakenBeforeConfirmation(t *testing.T) {
	const ms = int64(time.Millisecond / time.Microsecond)
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: 10 * time.Second}
	w := p.WindowMicros()
	s := int64(1_700_000_000_000_000) // the snapshots' time, µs
	confirmed := s + 500*ms
	// The store's log at s: the end of a refresh burst (72 grants aged
	// 9.06-9.95 s, the oldest bucket) and 28 newer ones.
	var store []int64
	for k := range int64(72) {
		store = append(store, s-w+50*ms+k*125*ms/10)
	}
	for k := range int64(28) {
		store = append(store, s-300*ms+k*10*ms)
	}
	var l algorithm.WindowLog
	var snap ratelimit.State
	for _, at := range store {
		d := algorithm.WindowLogDecide(p, &l, at, 1, ratelimit.Weight{})
		if !d.Allowed {
			t.Fatal("setup: the store refused")
		}
	}
	snap = algorithm.WindowLogDecide(p, &l, s, 0, ratelimit.Weight{}).State
	if snap.Ages[7] != 72 || snap.Ages[0] != 28 {
		t.Fatalf("setup: ages %v", snap.Ages)
	}
	// The others retake each place that frees before confirmed, at once.
	var retaken []int64
	for _, at := range store {
		if at+w <= confirmed {
			retaken = append(retaken, at+w)
		}
	}
	sh := share{n: 4, factor: 1, confirmed: confirmed}
	instances := make([]entry, 4)
	var local []int64
	inWindow := func(times []int64, now int64) int {
		n := 0
		for _, at := range times {
			if at <= now && at > now-w {
				n++
			}
		}
		return n
	}
	for now := s; now < s+2*w; now += 10 * ms {
		for i := range instances {
			e := &instances[i]
			if !e.localInit {
				e.snap, e.snapValid = snap, true
			}
			if e.decideLocal(p, now, 1, sh).Allowed {
				local = append(local, now)
			}
		}
		if n := inWindow(store, now) + inWindow(retaken, now) + inWindow(local, now); n > int(p.Limit) {
			t.Fatalf("at +%d ms the window holds %d (store %d, retaken %d, local %d), more than the limit %d",
				(now-s)/ms, n, inWindow(store, now), inWindow(retaken, now), inWindow(local, now), p.Limit)
		}
	}
	if len(local) == 0 {
		t.Fatal("no local grant in two windows: the shares never freed")
	}
}
