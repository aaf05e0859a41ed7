package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// TestRaiseIsAMaxMerge: a key that Redis set back to an earlier state (as a
// replica promoted while behind holds it) is raised to the floor a later
// reply showed, exactly: the part it kept is not counted twice, and raising
// again, or to an older floor, changes nothing.
func TestRaiseIsAMaxMerge(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	client := newClient(t, srv.Addr())
	l := redisstore.New(client, redisstore.Config{})
	ctx := context.Background()
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.SlidingWindowCounter, ratelimit.SlidingWindowLog} {
		t.Run(string(alg), func(t *testing.T) {
			p := ratelimit.Policy{Name: "raise", Algorithm: alg, Limit: 20, Window: 24 * time.Hour}
			decide := func(n int) contract.Floor {
				t.Helper()
				var d contract.Decision
				for range n {
					var err error
					if d, err = l.DecideWire(ctx, contract.Request{Request: ratelimit.Request{Policy: p, Key: "k"}}); err != nil || !d.Allowed {
						t.Fatalf("%+v %v", d, err)
					}
				}
				return contract.Floor{Policy: p, Identity: store.IdentityOf("k"), State: d.State}
			}
			key := l.Key(p, "k")
			f5 := decide(5)
			dump, err := client.Dump(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			f8 := decide(3)
			// Redis forgets the last 3: the key is back as it was after 5.
			if err := client.RestoreReplace(ctx, key, time.Hour, dump).Err(); err != nil {
				t.Fatal(err)
			}
			for i, c := range []struct {
				floors []contract.Floor
				want   []int64
			}{
				{[]contract.Floor{f8}, []int64{3}},
				{[]contract.Floor{f8, f5}, []int64{0, 0}}, // again, and an older floor
			} {
				got, errs := l.Ext().Raise(ctx, c.floors)
				for j := range got {
					if errs[j] != nil || got[j] != c.want[j] {
						t.Fatalf("raise %d, floor %d: %d units put back (%v), want %d", i, j, got[j], errs[j], c.want[j])
					}
				}
			}
			d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"})
			if err != nil || !d.Allowed || d.Remaining != 20-9 {
				t.Fatalf("after the raise: %+v %v, want %d remaining: the 8 before it count once", d, err, 20-9)
			}
		})
	}
}

// TestSuspendMarksSuspectAtOnce: an instance that goes local marks itself,
// and the next heartbeat of another instance counts it as suspect (holding
// its share back) instead of live, without waiting for its heartbeat to
// lapse; its next heartbeat makes it live again.
func TestSuspendMarksSuspectAtOnce(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{})
	ctx := context.Background()
	ttl, grace := 10*time.Second, 30*time.Second
	for _, inst := range []string{"a", "b"} {
		if _, err := l.Heartbeat(ctx, inst, ttl, grace); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Ext().Suspend(ctx, "b", ttl, grace); err != nil {
		t.Fatal(err)
	}
	f, err := l.Heartbeat(ctx, "a", ttl, grace)
	if err != nil || f.Live != 1 || f.Suspect != 1 {
		t.Fatalf("after b suspended: %+v %v, want 1 live and 1 suspect", f, err)
	}
	if err := l.Ext().Suspend(ctx, "unknown", ttl, grace); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Heartbeat(ctx, "b", ttl, grace); err != nil {
		t.Fatal(err)
	}
	if f, err = l.Heartbeat(ctx, "a", ttl, grace); err != nil || f.Live != 2 || f.Suspect != 0 {
		t.Fatalf("after b beat again: %+v %v, want 2 live (an unknown instance's suspend adds nobody)", f, err)
	}
}
