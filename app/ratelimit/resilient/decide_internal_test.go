package resilient

import (
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/statekey"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// TestSnapshotIsTheNewestReply: the callers of a shared pipeline wake in
// any order, and a late reply comes after newer ones: the key's snapshot
// is the reply with the latest store time, whichever was processed last.
func TestSnapshotIsTheNewestReply(t *testing.T) {
	l := &Limiter{seeds: statekey.NewSeeds()}
	var err error
	if l.keys, err = newKeyTable(16, func(key, *entry) {}); err != nil {
		t.Fatal(err)
	}
	p := ratelimit.Policy{Name: "p", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Second}
	req := ratelimit.Request{Policy: p, Key: "k"}
	id := store.IdentityOf(req.Key)
	k := l.keyOfIdentity(p, id)
	newer := ratelimit.Decision{Allowed: true, State: ratelimit.State{Now: 2_000_000, TAT: 2_500_000}}
	older := ratelimit.Decision{Allowed: true, State: ratelimit.State{Now: 1_000_000, TAT: 1_100_000}}
	now := time.Now()
	l.remember(k, req, id, newer, now, now)
	l.remember(k, req, id, older, now, now)
	sh := l.keys.shard(k)
	sh.mu.Lock()
	got := sh.entry(k).snap
	sh.mu.Unlock()
	if got != newer.State {
		t.Fatalf("snapshot %+v, want the newer reply's %+v", got, newer.State)
	}
}
