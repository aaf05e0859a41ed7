package memstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/conformance"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/vectors"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
)

func TestConformance(t *testing.T) {
	// Instances of an in-memory limiter share nothing, so the suite gets
	// the same one for every "instance" of a subtest.
	conformance.Run(t, ratelimit.ModeMemory, func(t *testing.T) ratelimit.Limiter { return shared })
}

var shared = memstore.New(memstore.Config{})

func TestVectors(t *testing.T) {
	for _, c := range vectors.All() {
		t.Run(c.Name, func(t *testing.T) {
			var now int64
			l := memstore.New(memstore.Config{Clock: func() time.Time { return time.UnixMicro(now) }})
			wire := contract.Extension(l).(contract.Decider)
			for i, s := range c.Steps {
				now = vectors.T0 + s.At
				req := contract.Request{Request: ratelimit.Request{Policy: c.Policy, Key: "k", Cost: s.Cost, ReadOnly: s.ReadOnly}, Weight: s.Weight}
				ds, errs := wire.DecideWire(context.Background(), []contract.Request{req})
				if errs[0] != nil {
					t.Fatal(errs[0])
				}
				got := ds[0]
				want := c.Decision(s)
				want.Mode = ratelimit.ModeMemory
				if got != want {
					t.Errorf("step %d:\n got %+v\nwant %+v", i, got, want)
				}
			}
		})
	}
}

func TestCapacityEvictsLeastRecentlyUsed(t *testing.T) {
	l := memstore.New(memstore.Config{Capacity: 2})
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 1, Window: time.Hour}
	ctx := context.Background()
	for _, k := range []string{"a", "b", "a", "c"} { // "b" is evicted by "c"
		if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	if n, ev := l.Stats(); n != 2 || ev != 1 {
		t.Fatalf("len %d evictions %d, want 2 and 1", n, ev)
	}
	if d, _ := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "a"}); d.Allowed {
		t.Fatal("a was kept and spent: want refused")
	}
	if d, _ := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "b"}); !d.Allowed {
		t.Fatal("b was evicted: want a fresh quota")
	}
}

func BenchmarkDecide(b *testing.B) {
	for _, alg := range contract.Algorithms {
		b.Run(string(alg), func(b *testing.B) {
			l := memstore.New(memstore.Config{})
			p := ratelimit.Policy{Name: "bench", Algorithm: alg, Limit: 1000, Window: time.Second}
			req := ratelimit.Request{Policy: p, Key: "client-1"}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Decide(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestReset(t *testing.T) {
	l := memstore.New(memstore.Config{})
	ctx := context.Background()
	a := ratelimit.Policy{Name: "a", Algorithm: ratelimit.SlidingWindowLog, Limit: 1, Window: time.Hour}
	b := ratelimit.Policy{Name: "b", Algorithm: ratelimit.GCRA, Limit: 1, Window: time.Hour}
	for _, p := range []ratelimit.Policy{a, b} {
		for _, k := range []string{"k:x", "k:y"} {
			if d, _ := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k}); !d.Allowed {
				t.Fatalf("%s %s: refused", p.Name, k)
			}
		}
	}
	if err := l.Reset(ctx, "k:x", a); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		p    ratelimit.Policy
		key  string
		want bool
	}{{a, "k:x", true}, {b, "k:x", false}, {a, "k:y", false}} {
		if d, _ := l.Decide(ctx, ratelimit.Request{Policy: c.p, Key: c.key}); d.Allowed != c.want {
			t.Errorf("%s %s after resetting k:x under a: allowed %v, want %v", c.p.Name, c.key, d.Allowed, c.want)
		}
	}
	if err := l.Reset(ctx, "", a); !errors.Is(err, ratelimit.ErrInvalidRequest) {
		t.Errorf("empty identity: %v", err)
	}
	if _, ev := l.Stats(); ev != 0 {
		t.Errorf("a reset counted as %d evictions", ev)
	}
}
