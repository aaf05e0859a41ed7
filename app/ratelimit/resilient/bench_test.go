package resilient_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// BenchmarkStoreDecisionParallel is the bookkeeping around a store decision
// (the cached-refusal check and the snapshot kept), the store being an
// in-memory twin: with one lock for every key, parallel callers queue on it.
func BenchmarkStoreDecisionParallel(b *testing.B) {
	f := newFakeStore()
	l, err := resilient.New(f, resilient.Config{Instance: "bench", ExpectedInstances: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	p := ratelimit.Policy{Name: "bench", Algorithm: ratelimit.GCRA, Limit: 1_000_000_000, Window: time.Second}
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := ratelimit.Request{Policy: p, Key: fmt.Sprint("client-", next.Add(1))}
		ctx := context.Background()
		for pb.Next() {
			if _, err := l.Decide(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkLocalDecision(b *testing.B) {
	f := newFakeStore()
	f.down.Store(true)
	l, err := resilient.New(f, resilient.Config{Instance: "bench", FailureThreshold: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	for _, alg := range contract.Algorithms {
		b.Run(string(alg), func(b *testing.B) {
			req := ratelimit.Request{Policy: ratelimit.Policy{Name: "bench", Algorithm: alg, Limit: 1000, Window: time.Second}, Key: "client-1"}
			ctx := context.Background()
			_, _ = l.Decide(ctx, req)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Decide(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFootprint reports the heap a remembered key costs (a store
// decision per distinct key: the LRU entry), and what a local grant of a
// distinct key adds (the journaled grant and the key's snapshot), per
// algorithm: go test -run ^$ -bench Footprint ./app/ratelimit/resilient.
func BenchmarkFootprint(b *testing.B) {
	const keys = 50_000
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for _, alg := range contract.Algorithms {
		b.Run(string(alg), func(b *testing.B) {
			p := ratelimit.Policy{Name: "bench", Algorithm: alg, Limit: 100, Window: 10 * time.Second}
			ctx := context.Background()
			var perKey, perGrant float64
			for b.Loop() {
				// A store that keeps nothing (the fake's twin and its
				// mock's call log would be counted with the limiter).
				f := &nullStore{}
				l, err := resilient.New(f, resilient.Config{Instance: "bench", FailureThreshold: 1, KeyCapacity: 2 * keys})
				if err != nil {
					b.Fatal(err)
				}
				before := heap()
				for i := range keys {
					if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k:client-" + strconv.Itoa(i)}); err != nil {
						b.Fatal(err)
					}
				}
				remembered := heap()
				f.down.Store(true)
				for i := range keys {
					// Fresh request ids, as nginx sends: 32 hex digits.
					id := fmt.Sprintf("%032x", i)
					if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k:client-" + strconv.Itoa(i), ID: id}); err != nil {
						b.Fatal(err)
					}
				}
				journaled := heap()
				if s := l.Status(); s.Journal.Pending != keys {
					b.Fatalf("journal holds %d grants, want %d (the breaker did not open?)", s.Journal.Pending, keys)
				}
				perKey = float64(int64(remembered)-int64(before)) / keys
				perGrant = float64(int64(journaled)-int64(remembered)) / keys
				_ = l.Close(ctx)
			}
			b.ReportMetric(perKey, "B/key")
			b.ReportMetric(perGrant, "B/grant")
		})
	}
}
