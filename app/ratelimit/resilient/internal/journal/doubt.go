// Doubts: grants whose requests' store calls timed out, held until the
// store says whether it counted them.

package journal

import (
	"fmt"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// AppendDoubt journals a local grant made for a request whose store call
// timed out: the store may still decide it (see Journal). g.ID names it for
// Resolve. Like Append, it returns ErrFull when the journal is full.
func (j *Journal) AppendDoubt(p ratelimit.Policy, id store.Identity, g store.Grant) error {
	if g.ID == "" {
		return fmt.Errorf("journal: a doubt needs a request id")
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.doubts[g.ID]; ok {
		return fmt.Errorf("journal: request %q is a doubt already", g.ID)
	}
	if j.fullLocked(g.Cost) {
		return ErrFull
	}
	j.addDoubtLocked(p, id, g)
	j.stats.granted.Add(uint64(g.Cost))
	if j.f == nil {
		return nil
	}
	j.buf = appendRecord(j.buf[:0], record{kind: 'D', epoch: j.epoch, policy: p, identity: id, grant: g})
	return j.writeLocked(j.buf)
}

func (j *Journal) addDoubtLocked(p ratelimit.Policy, id store.Identity, g store.Grant) {
	if _, ok := j.doubts[g.ID]; ok {
		return
	}
	ref := j.refLocked(p)
	j.doubts[g.ID] = &doubt{policy: ref, identity: id, grant: grant{g.At, g.Cost}}
	ke := j.keyLocked(ref.key, id)
	ke.doubts++
	ke.units += g.Cost
	j.pending += uint64(g.Cost)
	j.grants++
	j.size++
}

// Resolve settles the doubt of request reqID: present, the store counted
// the request, and the grant goes (counted as present); otherwise it
// becomes an ordinary grant, replayed with the others. It returns the
// doubt's policy, identity and cost, and false when there is no such doubt.
func (j *Journal) Resolve(reqID string, present bool) (ratelimit.Policy, store.Identity, int64, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	d, ok := j.doubts[reqID]
	if !ok {
		return ratelimit.Policy{}, store.Identity{}, 0, false
	}
	j.resolveLocked(reqID, present, j.epoch)
	if present {
		j.stats.present.Add(uint64(d.grant.cost))
	}
	if !j.emptyLocked() {
		j.writeResolveLocked(reqID, present)
	}
	return d.policy.p, d.identity, d.grant.cost, true
}

// resolveLocked settles the doubt of reqID, if there is one (see Resolve).
// An ordinary grant made of it joins the batch of epoch, the one in force
// when it was resolved: its own may have been replayed already, and a batch
// sent again under a marker the store has seen would be refused.
func (j *Journal) resolveLocked(reqID string, present bool, epoch uint64) {
	d, ok := j.doubts[reqID]
	if !ok {
		return
	}
	delete(j.doubts, reqID)
	sk := snapKey{d.policy.key, d.identity}
	ke := j.keys[sk]
	ke.doubts--
	ke.units -= d.grant.cost
	j.pending -= uint64(d.grant.cost)
	j.grants--
	j.size--
	if !present {
		j.addLocked(epoch, d.policy.p, d.identity, store.Grant{At: d.grant.at, Cost: d.grant.cost, ID: reqID})
		return
	}
	j.pruneKeyLocked(sk, ke)
}

// settleDoubtsLocked makes every doubt reloaded from the file an ordinary
// grant, and says so in the file: the late replies that would have
// resolved them went to the process that died. Counting them may count a
// request twice; dropping them could count it never.
func (j *Journal) settleDoubtsLocked() {
	for reqID := range j.doubts {
		j.settleLocked(reqID)
	}
}

// settleLocked makes the doubt reqID an ordinary grant, and says so in the
// file.
func (j *Journal) settleLocked(reqID string) {
	j.resolveLocked(reqID, false, j.epoch)
	j.writeResolveLocked(reqID, false)
}

// writeResolveLocked records the resolution of doubt reqID in the file.
func (j *Journal) writeResolveLocked(reqID string, present bool) {
	if j.f != nil {
		j.buf = appendRecord(j.buf[:0], record{kind: 'R', epoch: j.epoch, grant: store.Grant{ID: reqID}, present: present})
		_ = j.writeLocked(j.buf)
	}
}

// ExpireDoubts makes an ordinary grant of every doubt granted before
// before (store µs), whose late reply never came, and returns how many
// units it settled so.
func (j *Journal) ExpireDoubts(before int64) int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	var n int64
	for reqID, d := range j.doubts {
		if d.grant.at >= before {
			continue
		}
		n += d.grant.cost
		j.settleLocked(reqID)
	}
	return n
}

// Drop forgets the grants (doubts included) of the key of policy p and
// identity id made at or before through (store µs), counted as dropped: an
// operator lifted the key's limit at through, so that usage is not to be
// replayed; the key's grants made after it are usage the reset did not
// lift, and stay (a cut-off instance that hears of a reset only once it is
// back granted them from its share after the reset). The key's snapshot
// goes with its last grant. It returns the units dropped.
func (j *Journal) Drop(p ratelimit.Policy, id store.Identity, through int64) int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.keys) == 0 {
		return 0
	}
	ref := j.refLocked(p)
	sk := snapKey{ref.key, id}
	ke := j.keys[sk]
	if ke == nil {
		return 0
	}
	before := ke.units
	for reqID, d := range j.doubts {
		if d.policy == ref && d.identity == id && d.grant.at <= through {
			j.resolveLocked(reqID, true, j.epoch)
			j.writeResolveLocked(reqID, true)
		}
	}
	partial := false
	for epoch := range j.epochs {
		k := batchKey{epoch: epoch, policy: ref.key, identity: id}
		b := j.batches[k]
		if b == nil {
			continue
		}
		if j.dropThroughLocked(k, b, through) {
			partial = true
			continue
		}
		j.buf = appendRecord(j.buf[:0], record{kind: 'A', epoch: epoch, policy: p, fingerprint: ref.fingerprint(), identity: id})
		_ = j.writeLocked(j.buf)
	}
	if partial {
		j.buf = appendRecord(j.buf[:0], record{kind: 'X', policy: p, fingerprint: ref.fingerprint(), identity: id, grant: store.Grant{At: through}})
		_ = j.writeLocked(j.buf)
	}
	after := int64(0)
	if ke := j.keys[sk]; ke != nil {
		after = ke.units
		j.pruneKeyLocked(sk, ke)
		if ke.snap != nil && ke.batches == 0 && ke.doubts == 0 && j.keys[sk] != nil { // a snapshot alone
			j.size--
			delete(j.keys, sk)
		}
	}
	units := before - after
	j.stats.dropped.Add(uint64(units))
	j.emptyLocked()
	return units
}

// dropThroughLocked removes b's grants made at or before through. It drops
// the whole batch (and reports false) when none is left; it reports true
// when some grants stay.
func (j *Journal) dropThroughLocked(k batchKey, b *batch, through int64) bool {
	kept, ids, gone := b.grants[:0], b.ids[:0:0], uint64(0)
	for i, g := range b.grants {
		if g.at <= through {
			gone += uint64(g.cost)
			continue
		}
		kept = append(kept, g)
		if b.ids != nil {
			ids = append(ids, b.ids[i])
		}
	}
	if len(kept) == 0 { // nothing appended: b.grants is whole
		j.dropBatchLocked(k, b)
		return false
	}
	if gone == 0 {
		return true
	}
	n := len(b.grants) - len(kept)
	b.grants = kept
	if b.ids != nil {
		b.ids = ids
	}
	j.grants -= n
	j.size -= n
	j.pending -= gone
	if ke := j.keys[snapKey{k.policy, k.identity}]; ke != nil {
		ke.units -= int64(gone)
	}
	return true
}
