// Package conformance is the suite every ratelimit.Limiter implementation
// runs: validation, admission up to the capacity and not beyond, the
// numbers a decision reports, read-only requests, key and policy
// isolation, and concurrency.
// memstore and redisstore run it; a third-party Limiter (another store, a
// wrapper) runs it from its own tests:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, ratelimit.ModeRedis, func(t *testing.T) ratelimit.Limiter {
//			return mystore.New(...)
//		})
//	}
//
// It uses long windows (an hour) so that refill during a test is far below
// one unit: no clock control is needed, and any backend (including one whose
// time comes from Redis) can run it.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

// Run runs the suite against the limiters newLimiter returns, whose decisions
// report mode. Limiters it returns within one subtest must share state (as
// instances sharing one Redis do); every subtest uses keys of its own, so
// runs against one store do not meet.
func Run(t *testing.T, mode ratelimit.Mode, newLimiter func(t *testing.T) ratelimit.Limiter) {
	ctx := context.Background()
	var seq atomic.Int64
	key := func(t *testing.T) string {
		return fmt.Sprintf("%s-%d-%d", t.Name(), time.Now().UnixNano(), seq.Add(1))
	}
	for _, alg := range contract.Algorithms {
		p := ratelimit.Policy{Name: "conf-" + strings.ReplaceAll(string(alg), "_", "-"), Algorithm: alg, Limit: 10, Window: time.Hour}
		t.Run(string(alg), func(t *testing.T) {
			t.Run("admits capacity then refuses", func(t *testing.T) {
				l, k := newLimiter(t), key(t)
				for i := range 10 {
					d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k})
					if err != nil {
						t.Fatal(err)
					}
					if !d.Allowed || d.Remaining != int64(9-i) || d.Limit != 10 || d.Mode != mode || d.RetryAfter != 0 {
						t.Fatalf("request %d: %+v, want allowed with %d remaining in mode %s", i, d, 9-i, mode)
					}
					if d.ResetAfter <= 0 || d.ResetAfter > 2*time.Hour {
						t.Fatalf("request %d: reset after %v", i, d.ResetAfter)
					}
				}
				d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k})
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.RetryAfter > 2*time.Hour {
					t.Fatalf("11th request: %+v, want refused with a retry-after within two windows", d)
				}
			})
			t.Run("cost counts units", func(t *testing.T) {
				l, k := newLimiter(t), key(t)
				for _, c := range []struct {
					cost      int64
					allowed   bool
					remaining int64
				}{{4, true, 6}, {6, true, 0}, {1, false, 0}} {
					d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k, Cost: c.cost})
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed != c.allowed || d.Remaining != c.remaining {
						t.Fatalf("cost %d: %+v, want allowed=%v remaining=%d", c.cost, d, c.allowed, c.remaining)
					}
				}
			})
			t.Run("read-only requests take nothing", func(t *testing.T) {
				l, k := newLimiter(t), key(t)
				read := ratelimit.Request{Policy: p, Key: k, ReadOnly: true}
				if d := mustDecide(t, l, read); !d.Allowed || d.Remaining != 10 || d.Mode != mode {
					t.Fatalf("read of a fresh key: %+v, want allowed with 10 remaining", d)
				}
				mustDecide(t, l, ratelimit.Request{Policy: p, Key: k, Cost: 7})
				for range 3 {
					if d := mustDecide(t, l, read); !d.Allowed || d.Remaining != 3 {
						t.Fatalf("read after 7 units: %+v, want allowed with 3 remaining", d)
					}
				}
				if d := mustDecide(t, l, ratelimit.Request{Policy: p, Key: k, Cost: 3}); !d.Allowed || d.Remaining != 0 {
					t.Fatalf("3 units after the reads: %+v, want admitted: the reads took nothing", d)
				}
				if d := mustDecide(t, l, read); d.Remaining != 0 {
					t.Fatalf("read of an exhausted key: %+v, want 0 remaining", d)
				}
			})
			t.Run("keys and policies are independent", func(t *testing.T) {
				l, k := newLimiter(t), key(t)
				mustDecide(t, l, ratelimit.Request{Policy: p, Key: k, Cost: 10})
				other := p
				other.Name += "-other"
				for _, r := range []ratelimit.Request{
					{Policy: p, Key: k + "x"},
					{Policy: other, Key: k},
				} {
					if d := mustDecide(t, l, r); !d.Allowed || d.Remaining != 9 {
						t.Fatalf("%s/%s: %+v, want a fresh quota", r.Policy.Name, r.Key, d)
					}
				}
				// A reload with another limit keeps the key's usage (all
				// of the old limit: the window algorithms have 10 of 20
				// left, the token bucket none, GCRA none, its key full in
				// a window); another window starts afresh.
				changed := p
				changed.Limit = 20
				want := int64(0)
				if p.Algorithm == ratelimit.SlidingWindowLog || p.Algorithm == ratelimit.SlidingWindowCounter {
					want = 10
				}
				if d := mustDecide(t, l, ratelimit.Request{Policy: changed, Key: k, ReadOnly: true}); d.Remaining != want {
					t.Fatalf("limit changed to 20: %+v, want the usage kept (%d left)", d, want)
				}
				changed = p
				changed.Window *= 2
				if d := mustDecide(t, l, ratelimit.Request{Policy: changed, Key: k}); !d.Allowed || d.Remaining != 9 {
					t.Fatalf("window changed: %+v, want fresh state under the new window", d)
				}
			})
			t.Run("invalid requests are refused and not counted", func(t *testing.T) {
				l, k := newLimiter(t), key(t)
				bad := []struct {
					req  ratelimit.Request
					want error
				}{
					{ratelimit.Request{Policy: p, Key: ""}, ratelimit.ErrInvalidRequest},
					{ratelimit.Request{Policy: p, Key: strings.Repeat("k", ratelimit.MaxKeyBytes+1)}, ratelimit.ErrInvalidRequest},
					{ratelimit.Request{Policy: p, Key: "a\nb"}, ratelimit.ErrInvalidRequest},
					{ratelimit.Request{Policy: p, Key: k, Cost: 11}, ratelimit.ErrInvalidRequest},
					{ratelimit.Request{Policy: p, Key: k, Cost: -1}, ratelimit.ErrInvalidRequest},
					{ratelimit.Request{Policy: p, Key: k, Cost: 1, ReadOnly: true}, ratelimit.ErrInvalidRequest},
					{ratelimit.Request{Policy: ratelimit.Policy{Name: "x", Algorithm: alg, Limit: 0, Window: time.Second}, Key: k}, ratelimit.ErrInvalidPolicy},
					{ratelimit.Request{Policy: ratelimit.Policy{Name: "x", Algorithm: "leaky", Limit: 1, Window: time.Second}, Key: k}, ratelimit.ErrInvalidPolicy},
				}
				for _, b := range bad {
					if _, err := l.Decide(ctx, b.req); !errors.Is(err, b.want) {
						t.Errorf("%+v: error %v, want %v", b.req, err, b.want)
					}
				}
				if d := mustDecide(t, l, ratelimit.Request{Policy: p, Key: k}); d.Remaining != 9 {
					t.Fatalf("after invalid requests: %+v, want nothing counted", d)
				}
			})
			t.Run("hostile keys are just keys", func(t *testing.T) {
				l := newLimiter(t)
				base := key(t)
				for _, k := range []string{"{x}", "{" + base + "}", base + "{tag}", strings.Repeat("é", 20), "*", "rl:0001"} {
					if d := mustDecide(t, l, ratelimit.Request{Policy: p, Key: k + base}); !d.Allowed {
						t.Fatalf("key %q: %+v", k, d)
					}
				}
			})
			t.Run("concurrent instances never admit more than the capacity", func(t *testing.T) {
				k := key(t)
				limiters := []ratelimit.Limiter{newLimiter(t), newLimiter(t), newLimiter(t)}
				var admitted atomic.Int64
				var wg sync.WaitGroup
				for g := range 24 {
					wg.Go(func() {
						l := limiters[g%len(limiters)]
						for range 5 {
							d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k})
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								admitted.Add(1)
							}
						}
					})
				}
				wg.Wait()
				if got := admitted.Load(); got != 10 {
					t.Fatalf("admitted %d of 120 concurrent requests, want exactly 10", got)
				}
			})
		})
	}
}

func mustDecide(t *testing.T, l ratelimit.Limiter, r ratelimit.Request) ratelimit.Decision {
	t.Helper()
	d, err := l.Decide(context.Background(), r)
	if err != nil {
		t.Fatalf("%s/%s: %v", r.Policy.Name, r.Key, err)
	}
	return d
}
