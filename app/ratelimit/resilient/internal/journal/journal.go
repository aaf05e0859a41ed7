// Package journal records a rate limiter's local grants until its store has
// them: in memory, grouped by outage epoch and key, and in an append-only
// file that an instance killed during an outage reloads. The resilient
// limiter journals every grant it makes while its store is out and replays
// the journal (Pending, Ack) when the store is back.
package journal

import (
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/statekey"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// ErrFull: the journal holds its maximum of grants and snapshots; the grant
// must not be made (it is counted as overflow).
var ErrFull = errors.New("journal: full")

// Journal records every local grant until the store has it. Grants are kept
// in memory, grouped by outage epoch and key, and, when a directory is set,
// appended to a file (written before the grant's response is sent, fsync
// batched) so an instance killed during an outage reloads them.
//
// A grant made for a request whose store call timed out is a doubt: the
// store may have decided the request all the same, and will say so (see
// contract.LateReply). A doubt is held, and counts toward the key, but is
// not replayed until it is resolved: dropped when the store had counted the
// request, made an ordinary grant when it had not (or cannot say).
//
// File format, one record a line, tab-separated, each ending in the CRC-32
// of the line before it (record.go):
//
//	E <epoch>                                      an epoch begins
//	G <epoch> <policy> <alg> <limit> <window µs> <burst> <identity hex> <at µs> <cost> <request id>
//	D <epoch> ... as G                             a doubt
//	R <epoch> <request id> <0|1>                   the doubt was resolved (1: the store had it)
//	A <epoch> <policy> <fingerprint> <identity hex>  the batch was applied
//	X 0 <policy> <fingerprint> <identity hex> <µs>  the key's grants at or
//	                                               before µs were dropped (a reset)
//	S <epoch> <policy> <alg> <limit> <window µs> <burst> <identity hex> <snapshot...>
//	                                               what the key's local share started from
//
// One codec writes and reads every record (record.go; FuzzRecord checks
// that it is symmetric). A torn or corrupt line (a crash mid-write, a
// zero-filled tail) is skipped and counted (Stats.Corrupt), the lines after
// it are still read (FuzzLoad), and a torn last line is cut off before the
// file is appended to. It is safe for concurrent use.
type Journal struct {
	instance string
	max      int
	log      *slog.Logger

	mu      sync.Mutex
	epoch   uint64
	batches map[batchKey]*batch
	epochs  map[uint64]int        // batches held per epoch
	keys    map[snapKey]*keyEntry // per key: its snapshot and what it holds
	doubts  map[string]*doubt     // by request id
	// policies holds each policy once, for every batch and snapshot of it
	// (bounded by the policies configured, not by clients); dropped when
	// the journal empties.
	policies map[ratelimit.Policy]*policyRef
	lastRef  *policyRef // refLocked's last answer
	grants   int        // grants held, doubts included
	size     int        // grants and snapshots held: bounded by max
	pending  uint64     // the units of the grants held
	f        *os.File
	buf      []byte
	dirty    bool

	stats counters
	stop  chan struct{}
	done  chan struct{}
}

type batchKey struct {
	epoch    uint64
	policy   string // name and fingerprint
	identity store.Identity
}

// batch is one key's grants of one epoch, their times and costs in an
// array without pointers (the garbage collector does not scan it, and a
// grant costs 16 bytes). A grant's request id is kept only for the sliding
// window log, whose replay adds it as the member; the other algorithms'
// replays do not read it.
type batch struct {
	policy *policyRef
	grants []grant
	ids    []string // the sliding window log's: ids[i] is grants[i]'s
}

type grant struct{ at, cost int64 }

// units is the cost of the batch's grants.
func (b *batch) units() uint64 {
	var n uint64
	for _, g := range b.grants {
		n += uint64(g.cost)
	}
	return n
}

// appendTo appends the batch's grants to dst.
func (b *batch) appendTo(dst []store.Grant) []store.Grant {
	for i, g := range b.grants {
		rg := store.Grant{At: g.at, Cost: g.cost}
		if b.ids != nil {
			rg.ID = b.ids[i]
		}
		dst = append(dst, rg)
	}
	return dst
}

// doubt is a grant that waits for the store to say whether it counted the
// request (see Journal).
type doubt struct {
	policy   *policyRef
	identity store.Identity
	grant    grant
}

// policyRef is a policy and its key (name and fingerprint), held once.
type policyRef struct {
	key string
	p   ratelimit.Policy
}

// snapKey names a key: its policy (name and fingerprint) and identity.
type snapKey struct {
	policy   string
	identity store.Identity
}

// keyEntry is what the journal holds of one key: the snapshot its local
// share started from, and how many batches and doubts it has. It goes once
// the key holds no grant, with its snapshot.
type keyEntry struct {
	snap    *snapEntry
	batches int
	doubts  int
	units   int64 // the cost of its grants, doubts included
}

// snapEntry is a Snapshot as the journal holds it.
type snapEntry struct {
	policy    *policyRef
	state     contract.State
	valid     bool
	n         float64
	confirmed int64
}

// Snapshot is what a key's local share started from in an outage: the last
// store reply (if any), the fleet size and when the others could know this
// instance was missing. Journaled with the key's first local grant, so a
// restarted instance rebuilds the same share.
type Snapshot struct {
	Policy    ratelimit.Policy
	Identity  store.Identity
	State     contract.State
	Valid     bool // State holds a store reply
	N         float64
	Confirmed int64
}

func (s *snapEntry) snapshot(id store.Identity) Snapshot {
	return Snapshot{Policy: s.policy.p, Identity: id, State: s.state, Valid: s.valid, N: s.n, Confirmed: s.confirmed}
}

// epochNow is the least epoch a journal opened or rotated now may use: the
// clock in µs. Epochs name replay markers in the store, so they must not
// repeat across process lifetimes even when the journal file is lost (a
// memory-only journal, a container without its volume, two processes with
// one instance name): a repeated epoch's batch would be refused as a
// duplicate and its grants silently dropped.
func epochNow() uint64 { return uint64(max(time.Now().UnixMicro(), 1)) }

func policyKey(p ratelimit.Policy) string { return p.Name + "/" + fingerprint(p) }

// fingerprint tells the batches of a policy reloaded with other
// parameters from the old one's (statekey.Params).
func fingerprint(p ratelimit.Policy) string { return statekey.Params(p) }

// fingerprint is the fingerprint part of the policy's key.
func (r *policyRef) fingerprint() string { return r.key[len(r.p.Name)+1:] }

// refLocked returns the journal's one copy of p.
// The last one returned is checked first: an outage's grants mostly
// share a policy, and comparing one is cheaper than hashing it.
func (j *Journal) refLocked(p ratelimit.Policy) *policyRef {
	if r := j.lastRef; r != nil && r.p == p {
		return r
	}
	r := j.policies[p]
	if r == nil {
		r = &policyRef{key: policyKey(p), p: p}
		j.policies[p] = r
	}
	j.lastRef = r
	return r
}

// keyLocked returns the entry of the key (policy key, id), adding one.
func (j *Journal) keyLocked(policy string, id store.Identity) *keyEntry {
	k := snapKey{policy, id}
	e := j.keys[k]
	if e == nil {
		e = &keyEntry{}
		j.keys[k] = e
	}
	return e
}

// pruneKeyLocked drops the key's entry, and its snapshot, once it holds no
// grant: snapshots do not outlive the grants they explain.
func (j *Journal) pruneKeyLocked(k snapKey, e *keyEntry) {
	if e.batches > 0 || e.doubts > 0 {
		return
	}
	if e.snap != nil {
		j.size--
	}
	delete(j.keys, k)
}

func (j *Journal) addLocked(epoch uint64, p ratelimit.Policy, id store.Identity, g store.Grant) {
	ref := j.refLocked(p)
	k := batchKey{epoch: epoch, policy: ref.key, identity: id}
	b := j.batches[k]
	ke := j.keyLocked(ref.key, id)
	if b == nil {
		b = &batch{policy: ref}
		j.batches[k] = b
		j.epochs[epoch]++
		ke.batches++
	}
	b.grants = append(b.grants, grant{g.At, g.Cost})
	if p.Algorithm == ratelimit.SlidingWindowLog {
		b.ids = append(b.ids, g.ID)
	}
	ke.units += g.Cost
	j.pending += uint64(g.Cost)
	j.grants++
	j.size++
}

// dropBatchLocked removes batch b (key k) with its grants.
func (j *Journal) dropBatchLocked(k batchKey, b *batch) {
	delete(j.batches, k)
	if j.epochs[k.epoch]--; j.epochs[k.epoch] <= 0 {
		delete(j.epochs, k.epoch)
	}
	units := b.units()
	j.grants -= len(b.grants)
	j.size -= len(b.grants)
	j.pending -= units
	sk := snapKey{k.policy, k.identity}
	if ke := j.keys[sk]; ke != nil {
		ke.batches--
		ke.units -= int64(units)
		j.pruneKeyLocked(sk, ke)
	}
}

// putSnapLocked keeps s as its key's latest snapshot; a key's first counts
// toward the bound.
func (j *Journal) putSnapLocked(s Snapshot) {
	ref := j.refLocked(s.Policy)
	ke := j.keyLocked(ref.key, s.Identity)
	if ke.snap == nil {
		j.size++
	}
	ke.snap = &snapEntry{policy: ref, state: s.State, valid: s.Valid, n: s.N, confirmed: s.Confirmed}
}

// full reports, and counts, a grant of cost that does not fit.
func (j *Journal) fullLocked(cost int64) bool {
	if j.size < j.max {
		return false
	}
	if j.stats.overflow.Add(uint64(cost)) == uint64(cost) {
		j.log.Error("journal full: local grants are refused until the store takes the journal", "max", j.max)
	}
	return true
}

// Append journals a local grant. It returns ErrFull when the journal is
// full (the grant must be refused; it is counted as overflow), or the
// file's write error; the grant stays in memory in the second case.
func (j *Journal) Append(p ratelimit.Policy, id store.Identity, g store.Grant) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.fullLocked(g.Cost) {
		return ErrFull
	}
	j.addLocked(j.epoch, p, id, g)
	j.stats.granted.Add(uint64(g.Cost))
	if j.f == nil {
		return nil
	}
	j.buf = appendRecord(j.buf[:0], record{kind: 'G', epoch: j.epoch, policy: p, identity: id, grant: g})
	return j.writeLocked(j.buf)
}

// AppendSnapshot journals what a key's local share started from (before its
// first local grant). It counts toward the journal's bound, and goes when
// the key's grants have gone.
func (j *Journal) AppendSnapshot(s Snapshot) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.size >= j.max {
		return ErrFull
	}
	j.putSnapLocked(s)
	if j.f == nil {
		return nil
	}
	j.buf = appendRecord(j.buf[:0], snapshotRecord(j.epoch, s))
	return j.writeLocked(j.buf)
}

// Rotate starts a new epoch and returns the one before it: grants from now
// on go to the new epoch, so a replay of the old ones is not mixed with
// grants made while it runs.
func (j *Journal) Rotate() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	old := j.epoch
	j.epoch = max(j.epoch+1, epochNow())
	j.writeEpochLocked()
	return old
}

// Pending returns the batches of epochs up to and including through, as
// replay batches (the marker names the instance and epoch), and each
// batch's key's latest snapshot (nil: none journaled, or the key is not a
// token bucket's or GCRA's, whose replays alone use it). Doubts are not
// among them until they are resolved.
func (j *Journal) Pending(through uint64) ([]store.ReplayBatch, []*Snapshot) {
	j.mu.Lock()
	defer j.mu.Unlock()
	n, grants := 0, 0
	for k, b := range j.batches {
		if k.epoch <= through {
			n, grants = n+1, grants+len(b.grants)
		}
	}
	// One array for every batch's grants (copies: the caller may sort
	// them) and one marker string per epoch.
	out := make([]store.ReplayBatch, 0, n)
	snaps := make([]*Snapshot, 0, n)
	all := make([]store.Grant, 0, grants)
	held := make([]Snapshot, 0, n) // the snapshots, in one array
	markers := map[uint64]string{}
	for k, b := range j.batches {
		if k.epoch > through {
			continue
		}
		m, ok := markers[k.epoch]
		if !ok {
			m = j.instance + ":" + strconv.FormatUint(k.epoch, 10)
			markers[k.epoch] = m
		}
		start := len(all)
		all = b.appendTo(all)
		out = append(out, store.ReplayBatch{Policy: b.policy.p, Identity: k.identity, Marker: m, Grants: all[start:len(all):len(all)]})
		// Only the token bucket's and GCRA's replays net a key's grants
		// against its share's snapshot.
		var snap *Snapshot
		if a := b.policy.p.Algorithm; a == ratelimit.TokenBucket || a == ratelimit.GCRA {
			if ke := j.keys[snapKey{k.policy, k.identity}]; ke != nil && ke.snap != nil {
				held = append(held, ke.snap.snapshot(k.identity))
				snap = &held[len(held)-1] // held has room for n: never moved
			}
		}
		snaps = append(snaps, snap)
	}
	return out, snaps
}

// Ack removes batches the store applied (or refused as duplicates), with
// their results (results[i] for batches[i]), and records them in the file in
// one write, so a restart does not replay them again.
func (j *Journal) Ack(batches []store.ReplayBatch, results []store.ReplayResult) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.buf = j.buf[:0]
	// A pass's batches share a few policies and markers: each is parsed
	// once (a drain of 100 000 keys spent most of its Ack on them).
	var (
		lastMarker string
		epoch      uint64
		epochErr   error
		fps        = map[ratelimit.Policy]string{}
	)
	for i, b := range batches {
		if i == 0 || b.Marker != lastMarker {
			lastMarker = b.Marker
			epoch, epochErr = strconv.ParseUint(b.Marker[strings.LastIndexByte(b.Marker, ':')+1:], 10, 64)
		}
		if epochErr != nil {
			continue
		}
		fp, ok := fps[b.Policy]
		if !ok {
			fp = fingerprint(b.Policy)
			fps[b.Policy] = fp
		}
		k := batchKey{epoch: epoch, policy: b.Policy.Name + "/" + fp, identity: b.Identity}
		held, ok := j.batches[k]
		if !ok {
			continue
		}
		units := held.units()
		j.dropBatchLocked(k, held)
		if r := results[i]; r.Duplicate {
			j.stats.duplicates.Add(1)
			j.stats.dupUnits.Add(units)
		} else {
			if a := b.Policy.Algorithm; a == ratelimit.TokenBucket || a == ratelimit.GCRA {
				// Their folds drop nothing, and the batch may have gone
				// to the store as one charge net of refill (resilient's
				// replay): every grant it held is accounted for.
				r.Replayed, r.Dropped, r.Present = int64(units), 0, 0
			}
			j.stats.replayed.Add(uint64(r.Replayed))
			j.stats.dropped.Add(uint64(r.Dropped))
			j.stats.present.Add(uint64(r.Present))
			if r.DuplicateUnits > 0 {
				// Part of the batch was applied by an earlier, failed send.
				j.stats.duplicates.Add(1)
				j.stats.dupUnits.Add(uint64(r.DuplicateUnits))
			}
		}
		j.buf = appendRecord(j.buf, record{kind: 'A', epoch: epoch, policy: b.Policy, fingerprint: fp, identity: b.Identity})
	}
	if j.emptyLocked() {
		return
	}
	if len(j.buf) > 0 {
		if err := j.writeLocked(j.buf); err != nil {
			j.log.Error("journal: write ack", "err", err)
		}
	}
}

// emptyLocked starts the journal afresh, file included, when it holds no
// grant, and reports whether it did.
func (j *Journal) emptyLocked() bool {
	if j.grants > 0 {
		return false
	}
	j.size = 0
	clear(j.keys)
	clear(j.policies)
	j.lastRef = nil
	if j.f != nil {
		if err := j.f.Truncate(0); err != nil {
			return false
		}
		j.writeEpochLocked()
	}
	return true
}
