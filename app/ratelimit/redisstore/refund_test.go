package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// TestRefundUndoesAnAdmission: a key that admitted five requests and had
// the last refunded holds what a key that admitted four holds, for every
// algorithm, with a weight too; a second refund of the same request finds
// nothing more to give back only where the state records the request (the
// sliding window log's member).
func TestRefundUndoesAnAdmission(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	ctx := context.Background()
	for _, w := range []contract.Weight{{}, {Num: 4, Den: 3}} {
		for _, alg := range contract.Algorithms {
			t.Run(fmt.Sprintf("%s/%d-%d", alg, w.Num, w.Den), func(t *testing.T) {
				now := time.Unix(1_700_000_000, 0)
				l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{Clock: func() time.Time { return now }})
				p := ratelimit.Policy{Name: "refund-" + string(alg), Algorithm: alg, Limit: 20, Window: time.Hour}
				decide := func(key, id string) contract.Decision {
					t.Helper()
					d, err := l.DecideWire(ctx, contract.Request{Request: ratelimit.Request{Policy: p, Key: key, ID: id}, Weight: w})
					if err != nil || !d.Allowed {
						t.Fatalf("%s %s: %+v %v", key, id, d, err)
					}
					return d
				}
				key := fmt.Sprintf("refunded-%d-%d", w.Num, w.Den)
				ref := fmt.Sprintf("reference-%d-%d", w.Num, w.Den)
				var last contract.Decision
				for i := range 5 {
					last = decide(key, fmt.Sprint("a", i))
					if i < 4 {
						decide(ref, fmt.Sprint("b", i))
					}
				}
				got, err := l.Ext().Refund(ctx, contract.Request{Request: ratelimit.Request{Policy: p, Key: key, ID: "a4"}, Weight: w}, last)
				if err != nil || got != 1 {
					t.Fatalf("refund: %d units back, %v; want 1", got, err)
				}
				if a, b := decide(key, "next-a"), decide(ref, "next-b"); a.Remaining != b.Remaining || a.ResetAfter != b.ResetAfter {
					t.Fatalf("after the refund: %+v; a key that admitted one less: %+v", a, b)
				}
			})
		}
	}
}
