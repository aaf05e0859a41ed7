// What the journal holds, read: its size, a key's grants, its counters.

package journal

import (
	"cmp"
	"slices"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// Len returns the number of grants held, doubts included.
func (j *Journal) Len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.grants
}

// Held returns the units the journal holds for the key of policy p and
// identity id, doubts included: grants the store does not have (yet).
func (j *Journal) Held(p ratelimit.Policy, id store.Identity) int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.keys) == 0 {
		return 0
	}
	if ke := j.keys[snapKey{j.refLocked(p).key, id}]; ke != nil {
		return ke.units
	}
	return 0
}

// Key returns what the journal holds of the key of policy p and identity id:
// its snapshot (nil: none) and its grants, doubts included, in time order.
// The resilient limiter rebuilds a key's local share from them when it has
// forgotten the key (evicted it, or restarted).
func (j *Journal) Key(p ratelimit.Policy, id store.Identity) (*Snapshot, []store.Grant) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.keys) == 0 {
		return nil, nil
	}
	ref := j.refLocked(p)
	ke := j.keys[snapKey{ref.key, id}]
	if ke == nil {
		return nil, nil
	}
	var snap *Snapshot
	if ke.snap != nil {
		s := ke.snap.snapshot(id)
		snap = &s
	}
	var grants []store.Grant
	if ke.batches > 0 {
		for epoch := range j.epochs {
			if b := j.batches[batchKey{epoch: epoch, policy: ref.key, identity: id}]; b != nil {
				grants = b.appendTo(grants)
			}
		}
	}
	if ke.doubts > 0 {
		for reqID, d := range j.doubts {
			if d.policy == ref && d.identity == id {
				grants = append(grants, store.Grant{At: d.grant.at, Cost: d.grant.cost, ID: reqID})
			}
		}
	}
	slices.SortFunc(grants, func(a, b store.Grant) int { return cmp.Compare(a.At, b.At) })
	return snap, grants
}

// Stats returns the counters, read at one instant under the journal's lock:
// a grant Append was given is in Granted or Overflow, and in Pending until
// acknowledged, never in one and not the other.
func (j *Journal) Stats() Stats {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := &j.stats
	return Stats{
		Granted: s.granted.Load(), Reloaded: s.reloaded.Load(), Overflow: s.overflow.Load(),
		Replayed: s.replayed.Load(), Present: s.present.Load(), Dropped: s.dropped.Load(),
		DuplicateUnits: s.dupUnits.Load(), Duplicates: s.duplicates.Load(),
		Pending: j.pending, Doubts: len(j.doubts), Corrupt: s.corrupt.Load(), WriteErrors: s.writeErrors.Load(), Epoch: j.epoch,
		Held: j.size, Max: j.max,
	}
}

// Each calls fn for every grant held, doubts included, in time order, with
// the key's snapshot if one was journaled (for rebuilding budgets after a
// restart). fn runs without the journal's lock.
func (j *Journal) Each(fn func(p ratelimit.Policy, id store.Identity, g store.Grant, s *Snapshot)) {
	type item struct {
		p  ratelimit.Policy
		id store.Identity
		g  store.Grant
		s  *Snapshot
	}
	snapOf := func(policy string, id store.Identity) *Snapshot {
		if ke := j.keys[snapKey{policy, id}]; ke != nil && ke.snap != nil {
			s := ke.snap.snapshot(id)
			return &s
		}
		return nil
	}
	j.mu.Lock()
	var items []item
	for k, b := range j.batches {
		snap := snapOf(k.policy, k.identity)
		for _, g := range b.appendTo(nil) {
			items = append(items, item{b.policy.p, k.identity, g, snap})
		}
	}
	for reqID, d := range j.doubts {
		g := store.Grant{At: d.grant.at, Cost: d.grant.cost, ID: reqID}
		items = append(items, item{d.policy.p, d.identity, g, snapOf(d.policy.key, d.identity)})
	}
	j.mu.Unlock()
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(a.g.At, b.g.At) })
	for _, it := range items {
		fn(it.p, it.id, it.g, it.s)
	}
}
