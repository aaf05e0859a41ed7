package journal_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient/internal/journal"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// BenchmarkPendingAck is an instance's share of a drain of 100 000 keys: a
// journal file of 25 000 GCRA keys, each with a snapshot and one grant,
// handed out by Pending and acknowledged in batches of 1000, as a replay
// pass does. The time is the pass's own work, before and between the
// store's replies.
func BenchmarkPendingAck(b *testing.B) {
	p := ratelimit.Policy{Name: "gcra", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Second}
	const keys = 25_000
	ids := make([]store.Identity, keys)
	for i := range ids {
		ids[i] = store.IdentityOf(fmt.Sprint("key-", i))
	}
	for b.Loop() {
		b.StopTimer()
		j, err := journal.Open(b.TempDir(), "app1", 0, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i, id := range ids {
			if err := j.AppendSnapshot(journal.Snapshot{Policy: p, Identity: id, N: 4}); err != nil {
				b.Fatal(err)
			}
			if err := j.Append(p, id, store.Grant{At: int64(i), Cost: 1}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		pending, _ := j.Pending(j.Rotate())
		for len(pending) > 0 {
			n := min(len(pending), 1000)
			j.Ack(pending[:n], make([]store.ReplayResult, n))
			pending = pending[n:]
		}
		b.StopTimer()
		if j.Len() != 0 {
			b.Fatalf("%d grants left", j.Len())
		}
		_ = j.Close()
		b.StartTimer()
	}
}
