// Restore: putting back into a store that lost its data the usage the
// snapshots knew.

package resilient

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// restore puts back into a store that lost data what this instance's
// snapshots knew of each key's usage. What the store says each key lost
// (contract.Lossy) decides how:
//
//   - All of it (Redis restarted empty): as replay batches of synthetic
//     grants: the sliding window log's grants at the latest times their age
//     buckets allow, the counter's counts in their windows, the token
//     bucket's and GCRA's deficit at the snapshot's time. Each batch's marker
//     names the new generation and not the instance, so the first instance
//     to restore a key wins and the others' batches are refused: the usage
//     is put back once, from the snapshot that reached the store first; then
//     each instance raises the key to its own snapshot (below), so that the
//     most recent one counts.
//   - Its recent writes (a replica promoted while behind): the key still
//     holds part of its usage, so adding would count that part twice. It is
//     raised to the snapshot instead (contract.Raiser): a max-merge, harmless to
//     repeat and to do from every instance. A raise after a journal's
//     replay would undo the replay's additions wherever another instance's
//     floor is higher, so when it raised anything, the caller replays its
//     journal only once every instance is back (and so has raised).
func (l *Limiter) restore(ctx context.Context, old, gen string) (raised bool, err error) {
	now := l.storeNow()
	sum := sha256.Sum256([]byte(gen))
	marker := "restore-" + hex.EncodeToString(sum[:8])
	loss := func(ratelimit.Policy, store.Identity) contract.Loss { return contract.LossAll }
	if s, ok := l.ext.(contract.Lossy); ok {
		loss = s.Loss(old, gen)
	}
	r, canRaise := l.ext.(contract.Raiser)
	var batches []store.ReplayBatch
	var floors []contract.Floor
	l.keys.each(func(e *entry) {
		if !e.snapValid || e.policy == nil || e.snap.Now < now-2*e.policy.Window.Microseconds() {
			return
		}
		switch loss(*e.policy, e.identity) {
		case contract.LossRecent:
			if canRaise {
				floors = append(floors, contract.Floor{Policy: *e.policy, Identity: e.identity, State: e.snap})
				return
			}
			fallthrough // adding counts the part that survived twice: too much, never too little
		case contract.LossAll:
			if g := restoreGrants(*e.policy, e.snap, marker); len(g) > 0 {
				batches = append(batches, store.ReplayBatch{Policy: *e.policy, Identity: e.identity, Marker: marker, Grants: g})
			}
			// The first instance's batch wins, and its snapshot may be
			// older than another's: every instance also raises the key
			// to its own, so the key ends up with the latest one.
			if canRaise {
				floors = append(floors, contract.Floor{Policy: *e.policy, Identity: e.identity, State: e.snap})
			}
		}
	})
	if len(batches) > 0 {
		l.cfg.Logger.Warn("Redis lost its data: restoring the usage the snapshots knew", "keys", len(batches))
		if _, err := l.send(ctx, batches, func([]store.ReplayBatch, []store.ReplayResult) {}); err != nil {
			return false, err
		}
		l.restores.Add(1)
	}
	if len(floors) > 0 {
		units, err := l.raise(ctx, r, floors)
		l.cfg.Logger.Warn("raised the keys to the usage the replies showed", "keys", len(floors), "units_put_back", units)
		if err != nil {
			return false, err
		}
		l.raises.Add(1)
		return true, nil
	}
	return false, nil
}

// raise sends floors to the store in pipelines of ReplayBatchKeys, each
// within ReplayTimeout, and returns the units put back. It stops at the
// first pipeline with a failure; the caller retries the whole raise, which
// is harmless (a max-merge).
func (l *Limiter) raise(ctx context.Context, r contract.Raiser, floors []contract.Floor) (uint64, error) {
	var units uint64
	for len(floors) > 0 {
		chunk := floors[:min(len(floors), l.cfg.ReplayBatchKeys)]
		floors = floors[len(chunk):]
		callCtx, cancel := context.WithTimeout(ctx, l.cfg.ReplayTimeout)
		raised, errs := r.Raise(callCtx, chunk)
		cancel()
		var firstErr error
		var got uint64
		for i, err := range errs {
			if err != nil {
				firstErr = cmp.Or(firstErr, err)
				continue
			}
			got += uint64(raised[i])
		}
		units += got
		l.raisedUnits.Add(got)
		if firstErr != nil {
			return units, firstErr
		}
		l.br.success()
	}
	return units, nil
}

// restoreGrants turns a snapshot into the grants that rebuild its usage.
func restoreGrants(p ratelimit.Policy, s contract.State, marker string) []store.Grant {
	w := p.Window.Microseconds()
	var g []store.Grant
	add := func(at, cost int64, id string) {
		if cost > 0 {
			g = append(g, store.Grant{At: at, Cost: cost, ID: marker + "-" + id})
		}
	}
	switch p.Algorithm {
	case ratelimit.SlidingWindowLog:
		for i, n := range s.Ages {
			add(s.Now-int64(i)*w/contract.AgeBuckets, n, strconv.Itoa(i))
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
