package resilient_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// TestInspectCountsNothing: Inspect reports a key's cached refusal while
// the store decides, and while it is out the key's local share (what a
// read-only request then finds) and its journaled grants; called again and
// again it takes nothing, adds no key and leaves the next decision as it
// would have been.
func TestInspectCountsNothing(t *testing.T) {
	for _, alg := range contract.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				l := newLimiter(t, f, resilient.Config{})
				p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
				ctx := context.Background()
				if ks := l.Inspect(p, "k"); ks != (resilient.KeyState{}) {
					t.Fatalf("an unknown key: %+v, want nothing", ks)
				}
				admit(t, l, p, "k", 60, ratelimit.ModeRedis)
				if ks := l.Inspect(p, "k"); ks != (resilient.KeyState{}) {
					t.Fatalf("decided in the store: %+v, want no share, refusal or journal", ks)
				}
				admit(t, l, p, "spent", 101, ratelimit.ModeRedis)
				ks := l.Inspect(p, "spent")
				if alg == ratelimit.SlidingWindowCounter { // its retry is not exact: never cached
					if !ks.RefusedUntil.IsZero() {
						t.Fatalf("a cached refusal for the counter: %+v", ks)
					}
				} else if !ks.RefusedUntil.After(time.Now()) || ks.RefusedUntil.After(time.Now().Add(p.Window)) {
					t.Fatalf("spent key: refused until %v, want within a window of now (%v)", ks.RefusedUntil, time.Now())
				}

				f.down.Store(true)
				if got := admit(t, l, p, "k", 5, ratelimit.ModeLocal); got != 5 {
					t.Fatalf("%d of 5 admitted locally", got)
				}
				keys, grants := l.Status().Keys, l.Status().LocalGrants
				want := l.Inspect(p, "k")
				if want.Share == nil || want.Journaled != 5 {
					t.Fatalf("after 5 local grants: %+v, want a share and 5 journaled", want)
				}
				fresh := l.Inspect(p, "only-inspected")
				if fresh.Share == nil || fresh.Share.Remaining != 25 || fresh.Journaled != 0 {
					t.Fatalf("a key the instance never saw: %+v, want a full share of 25", fresh)
				}
				for range 20 {
					if ks := l.Inspect(p, "k"); *ks.Share != *want.Share || ks.Journaled != want.Journaled {
						t.Fatalf("Inspect changed the key: %+v, then %+v", want.Share, ks.Share)
					}
					_ = l.Inspect(p, "only-inspected")
				}
				if st := l.Status(); st.Keys != keys || st.LocalGrants != grants {
					t.Fatalf("after the inspections: %d keys, %d local grants; want %d and %d", st.Keys, st.LocalGrants, keys, grants)
				}
				d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ReadOnly: true})
				if err != nil || d.Remaining != want.Share.Remaining {
					t.Fatalf("a read-only request: %+v %v, want the %d remaining Inspect showed", d, err, want.Share.Remaining)
				}
				d, err = l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"})
				if err != nil || !d.Allowed || d.Remaining != want.Share.Remaining-1 {
					t.Fatalf("the next request: %+v %v, want %d remaining", d, err, want.Share.Remaining-1)
				}
				if ks := l.Inspect(p, "k"); ks.Journaled != 6 {
					t.Fatalf("after a sixth local grant: %d journaled", ks.Journaled)
				}
				if ks := l.Inspect(p, "\x00bad"); ks != (resilient.KeyState{}) {
					t.Fatalf("an invalid key: %+v", ks)
				}
			})
		})
	}
}
