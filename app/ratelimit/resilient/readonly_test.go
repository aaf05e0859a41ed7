package resilient_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// TestReadOnlyTakesNothing: a read-only request reports what is left, in the
// store and from the local share, and takes nothing: no unit of the key, no
// local grant, nothing journaled to replay.
func TestReadOnlyTakesNothing(t *testing.T) {
	for _, alg := range contract.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeStore()
				var mu sync.Mutex
				replayed := map[store.Identity]bool{}
				replay := f.ReplayFunc
				f.ReplayFunc = func(ctx context.Context, bs []store.ReplayBatch) ([]store.ReplayResult, []error) {
					mu.Lock()
					for _, b := range bs {
						replayed[b.Identity] = true
					}
					mu.Unlock()
					return replay(ctx, bs)
				}
				l := newLimiter(t, f, resilient.Config{})
				p := ratelimit.Policy{Name: "p", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
				read := func(key string, mode ratelimit.Mode) ratelimit.Decision {
					t.Helper()
					d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: key, ReadOnly: true})
					if err != nil {
						t.Fatal(err)
					}
					if d.Mode != mode || !d.Allowed {
						t.Fatalf("read-only: %+v, want allowed in mode %s", d, mode)
					}
					return d
				}
				admit(t, l, p, "k", 60, ratelimit.ModeRedis)
				for range 5 {
					if d := read("k", ratelimit.ModeRedis); d.Remaining != 40 {
						t.Fatalf("in the store: %d remaining, want 40", d.Remaining)
					}
				}
				f.down.Store(true)
				for range 5 {
					// A quarter of the 40 left is this instance's share.
					if d := read("k", ratelimit.ModeLocal); d.Remaining != 10 {
						t.Fatalf("locally: %d remaining, want 10", d.Remaining)
					}
					if d := read("only-read", ratelimit.ModeLocal); d.Remaining != 25 {
						t.Fatalf("a new key locally: %d remaining, want 25", d.Remaining)
					}
				}
				if st := l.Status(); st.LocalGrants != 0 || st.Journal.Pending != 0 {
					t.Fatalf("after local reads: %d local grants, %d journaled, want none", st.LocalGrants, st.Journal.Pending)
				}
				if got := admit(t, l, p, "k", 30, ratelimit.ModeLocal); got != 10 {
					t.Fatalf("after the reads: %d local grants, want the whole share of 10", got)
				}
				f.down.Store(false)
				settle(3 * time.Second)
				if l.Breaker() != resilient.BreakerClosed {
					t.Fatalf("breaker %s after the store came back", l.Breaker())
				}
				mu.Lock()
				defer mu.Unlock()
				if want := map[store.Identity]bool{store.IdentityOf("k"): true}; !maps.Equal(replayed, want) {
					t.Fatalf("replayed the batches of %d identities, want only k's (the key only read has nothing to replay)", len(replayed))
				}
			})
		})
	}
}
