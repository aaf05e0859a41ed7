// Restore: putting back into a store that lost its data the usage the
// snapshots knew.

package resilient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// restore puts back into a store that lost its data what this instance's
// snapshots knew of each key's usage, as replay batches of synthetic grants:
// the sliding window log's grants at the latest times their age buckets
// allow, the counter's counts in their windows, the token bucket's and
// GCRA's deficit at the snapshot's time. Each batch's marker names the new
// generation and not the instance, so the first instance to restore a key
// wins and the others' batches are refused: the usage is put back once,
// from the most recent snapshot that reached the store first.
func (l *Limiter) restore(ctx context.Context, old, gen string) error {
	now := l.storeNow()
	sum := sha256.Sum256([]byte(gen))
	marker := "restore-" + hex.EncodeToString(sum[:8])
	inScope := func(ratelimit.Policy, ratelimit.Identity) bool { return true }
	if s, ok := l.store.(scoped); ok {
		inScope = s.RestoreScope(old, gen)
	}
	var batches []ratelimit.ReplayBatch
	l.keys.each(func(e *entry) {
		if !e.snapValid || e.policy == nil || e.snap.Now < now-2*e.policy.WindowMicros() || !inScope(*e.policy, e.identity) {
			return
		}
		if g := restoreGrants(*e.policy, e.snap, marker); len(g) > 0 {
			batches = append(batches, ratelimit.ReplayBatch{Policy: *e.policy, Identity: e.identity, Marker: marker, Grants: g})
		}
	})
	l.cfg.Logger.Warn("Redis lost its data: restoring the usage the snapshots knew", "keys", len(batches))
	if _, err := l.send(ctx, batches, func([]ratelimit.ReplayBatch, []ratelimit.ReplayResult) {}); err != nil {
		return err
	}
	l.restores.Add(1)
	return nil
}

// scoped is a Store whose data can be lost in parts (a Cluster's masters):
// RestoreScope says which keys a change of generation from old to new lost.
// redisstore.Limiter is one.
type scoped interface {
	RestoreScope(old, new string) func(ratelimit.Policy, ratelimit.Identity) bool
}

// restoreGrants turns a snapshot into the grants that rebuild its usage.
func restoreGrants(p ratelimit.Policy, s ratelimit.State, marker string) []ratelimit.Grant {
	w := p.WindowMicros()
	var g []ratelimit.Grant
	add := func(at, cost int64, id string) {
		if cost > 0 {
			g = append(g, ratelimit.Grant{At: at, Cost: cost, ID: marker + "-" + id})
		}
	}
	switch p.Algorithm {
	case ratelimit.SlidingWindowLog:
		for i, n := range s.Ages {
			add(s.Now-int64(i)*w/ratelimit.AgeBuckets, n, strconv.Itoa(i))
		}
	case ratelimit.SlidingWindowCounter:
		add(s.WindowStart-w, s.Previous, "p")
		add(s.WindowStart, s.Current, "c")
	case ratelimit.TokenBucket:
		add(s.Now, (p.Capacity()*w-s.Tokens+w-1)/w, "t")
	case ratelimit.GCRA:
		if ahead := (s.TAT-s.Now)*p.Limit + s.TATRem; ahead > 0 {
			add(s.Now, (ahead+w-1)/w, "t")
		}
	}
	return g
}
