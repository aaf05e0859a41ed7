package resilient

import (
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
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
	req := contract.Request{Request: ratelimit.Request{Policy: p, Key: "k"}}
	id := store.IdentityOf(req.Key)
	k := l.keyOfIdentity(p, id)
	newer := contract.Decision{Decision: ratelimit.Decision{Allowed: true}, State: contract.State{Now: 2_000_000, TAT: 2_500_000}}
	older := contract.Decision{Decision: ratelimit.Decision{Allowed: true}, State: contract.State{Now: 1_000_000, TAT: 1_100_000}}
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

// TestRecoveringOthersCountsWhoMayGrantLocally: the live instances whose
// stage is before closed are counted, this one excepted (its own entry is
// what it wrote with the heartbeat); one with no stage yet is not.
func TestRecoveringOthersCountsWhoMayGrantLocally(t *testing.T) {
	for _, c := range []struct {
		stages  []string
		written string
		want    int64
	}{
		{[]string{"g:3", "g:3", "g:3", "g:3"}, "g:3", 0},
		{[]string{"g:3", "g:2", "g:3", "g:0"}, "g:3", 2},
		{[]string{"g:2", "g:2", "g:3", "g:3"}, "g:2", 1}, // this one just closed
		{[]string{"g:3", "old:3", "", "g:3"}, "g:3", 0},  // another generation, no stage yet
		{[]string{"g:2", "g:1"}, "", 2},                  // this one's first beat
		{[]string{"g:2"}, "g:2", 0},
	} {
		if got := recoveringOthers(c.stages, c.written); got != c.want {
			t.Errorf("recoveringOthers(%q, %q) = %d, want %d", c.stages, c.written, got, c.want)
		}
	}
}

// TestWeightHoldsBackRecoveringInstances: a closed instance decides in the
// store as if it had the part of the policy that the instances deciding
// there have: live ones still recovering are held back like suspects, for
// the token bucket and GCRA.
func TestWeightHoldsBackRecoveringInstances(t *testing.T) {
	for _, c := range []struct {
		live, held, recovering int64
		want                   contract.Weight
	}{
		{4, 0, 0, contract.Weight{}},
		{4, 0, 1, contract.Weight{Num: 4, Den: 3}},
		{3, 1, 1, contract.Weight{Num: 4, Den: 2}},
		{4, 0, 3, contract.Weight{Num: 4, Den: 1}},
		{2, 0, 5, contract.Weight{Num: 2, Den: 1}},
	} {
		var l Limiter
		l.live.Store(c.live)
		l.heldBack.Store(c.held)
		l.recovering.Store(c.recovering)
		if got := l.weight(ratelimit.GCRA); got != c.want || !got.Valid() {
			t.Errorf("live %d, held back %d, recovering %d: %+v, want %+v", c.live, c.held, c.recovering, got, c.want)
		}
		if c.held == 0 {
			if got := l.weight(ratelimit.SlidingWindowCounter); got != (contract.Weight{}) {
				t.Errorf("sliding window counter, live %d, recovering %d: %+v, want the whole policy", c.live, c.recovering, got)
			}
		}
	}
}
