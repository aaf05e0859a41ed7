// Package journal records a rate limiter's local grants until its store has
// them: in memory, grouped by outage epoch and key, and in an append-only
// file that an instance killed during an outage reloads. The resilient
// limiter journals every grant it makes while its store is out and replays
// the journal (Pending, Ack) when the store is back.
package journal

// The file is one piece: the journal's memory and its file change together
// under one lock (append, epoch, pending, ack, reload), and the invariant
// that binds them is easier to check in one place. The record codec is in
// record.go.

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// ErrFull: the journal holds its maximum of grants; the grant was
// made but not journaled (counted as overflow).
var ErrFull = errors.New("journal: full")

// Journal records every local grant until the store has it. Grants are kept
// in memory, grouped by outage epoch and key, and, when a directory is set,
// appended to a file (written before the grant's response is sent, fsync
// batched) so an instance killed during an outage reloads them.
//
// File format, one record a line, tab-separated:
//
//	E <epoch>                                      an epoch begins
//	G <epoch> <policy> <alg> <limit> <window µs> <burst> <identity hex> <at µs> <cost> <request id>
//	A <epoch> <policy> <fingerprint> <identity hex>  the batch was applied
//	S <epoch> <policy> <alg> <limit> <window µs> <burst> <identity hex> <snapshot...>
//	                                               what the key's local share started from
//
// One codec writes and reads every record (record.go; FuzzRecord checks
// that it is symmetric). A torn or corrupt line (a crash mid-write, a
// zero-filled tail) is skipped and counted (Stats.Corrupt), and the
// lines after it are still read (FuzzLoad). It is safe for concurrent use.
type Journal struct {
	instance string
	max      int
	log      *slog.Logger

	mu      sync.Mutex
	epoch   uint64
	batches map[batchKey]*batch
	snaps   map[snapKey]snapEntry // the latest per key; dropped when the journal empties
	// policies holds each policy once, for every batch and snapshot of it
	// (bounded by the policies configured, not by clients); dropped when
	// the journal empties.
	policies map[ratelimit.Policy]*policyRef
	lastRef  *policyRef // refLocked's last answer
	size     int        // grants held, plus snapshots (both count toward max)
	pending  uint64     // the units of the grants held
	f        *os.File
	buf      []byte
	dirty    bool

	stats counters
	stop  chan struct{}
	done  chan struct{}
}

type counters struct {
	granted, reloaded, overflow          atomic.Uint64
	replayed, dropped, present, dupUnits atomic.Uint64
	duplicates, corrupt, writeErrors     atomic.Uint64
}

type batchKey struct {
	epoch    uint64
	policy   string // name and fingerprint
	identity ratelimit.Identity
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
func (b *batch) appendTo(dst []ratelimit.Grant) []ratelimit.Grant {
	for i, g := range b.grants {
		rg := ratelimit.Grant{At: g.at, Cost: g.cost}
		if b.ids != nil {
			rg.ID = b.ids[i]
		}
		dst = append(dst, rg)
	}
	return dst
}

// policyRef is a policy and its key (name and fingerprint), held once.
type policyRef struct {
	key string
	p   ratelimit.Policy
}

// snapEntry is a Snapshot as the journal holds it.
type snapEntry struct {
	policy    *policyRef
	state     ratelimit.State
	valid     bool
	n         float64
	confirmed int64
}

type snapKey struct {
	policy   string
	identity ratelimit.Identity
}

// Snapshot is what a key's local share started from in an outage: the last
// store reply (if any), the fleet size and when the others could know this
// instance was missing. Journaled with the key's first local grant, so a
// restarted instance rebuilds the same share.
type Snapshot struct {
	Policy    ratelimit.Policy
	Identity  ratelimit.Identity
	State     ratelimit.State
	Valid     bool // State holds a store reply
	N         float64
	Confirmed int64
}

// Stats are the journal's counters, in units (a grant of cost 3 is 3),
// since this process started (Reloaded: found in the file at start).
// Granted + Reloaded = Replayed + Present + Dropped + DuplicateUnits +
// Pending; Overflow grants were made but could not be journaled.
type Stats struct {
	Granted        uint64 `json:"granted"`
	Reloaded       uint64 `json:"reloaded"`
	Overflow       uint64 `json:"overflow"`
	Replayed       uint64 `json:"replayed"`
	Present        uint64 `json:"present"`
	Dropped        uint64 `json:"dropped"`
	DuplicateUnits uint64 `json:"duplicate_units"`
	Duplicates     uint64 `json:"duplicate_batches"`
	Pending        uint64 `json:"pending"`
	Corrupt        uint64 `json:"corrupt_lines"`
	WriteErrors    uint64 `json:"write_errors"`
	Epoch          uint64 `json:"epoch"`
}

// Reconcile checks the journal's books: every grant given or reloaded was
// replayed, found present, dropped as expired, refused as a duplicate, or is
// still pending.
func (s Stats) Reconcile() error {
	in, out := s.Granted+s.Reloaded, s.Replayed+s.Present+s.Dropped+s.DuplicateUnits+s.Pending
	if in != out {
		return fmt.Errorf("journal does not reconcile: granted %d + reloaded %d = %d, but replayed %d + present %d + dropped %d + duplicate_units %d + pending %d = %d",
			s.Granted, s.Reloaded, in, s.Replayed, s.Present, s.Dropped, s.DuplicateUnits, s.Pending, out)
	}
	return nil
}

const journalFile = "journal.log"

// Open opens (or creates) the journal in dir, reloading the grants it
// holds; dir "" keeps the journal in memory only. max bounds the grants
// held (0: one million).
func Open(dir, instance string, max int, logger *slog.Logger) (*Journal, error) {
	if max <= 0 {
		max = 1_000_000
	}
	if logger == nil {
		logger = slog.Default()
	}
	j := &Journal{instance: instance, max: max, log: logger, batches: map[batchKey]*batch{}, snaps: map[snapKey]snapEntry{},
		policies: map[ratelimit.Policy]*policyRef{}, epoch: epochNow(),
		stop: make(chan struct{}), done: make(chan struct{})}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("journal: %w", err)
		}
		path := filepath.Join(dir, journalFile)
		if err := j.load(path); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err != nil {
			return nil, fmt.Errorf("journal: %w", err)
		}
		j.f = f
	}
	j.mu.Lock()
	j.writeEpochLocked()
	j.mu.Unlock()
	go j.syncLoop()
	return j, nil
}

func (j *Journal) load(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer f.Close()
	var maxEpoch uint64
	err = readRecords(f, func(line []byte) {
		if line == nil || !j.apply(string(line), &maxEpoch) {
			j.stats.corrupt.Add(1)
		}
	})
	if err != nil {
		return fmt.Errorf("journal: read %s: %w", path, err)
	}
	j.epoch = max(maxEpoch+1, epochNow())
	for _, b := range j.batches {
		j.stats.reloaded.Add(b.units())
	}
	if n := j.stats.corrupt.Load(); n > 0 {
		j.log.Warn("journal: skipped unreadable lines", "file", path, "lines", n)
	}
	if n := j.size - len(j.snaps); n > 0 {
		j.log.Warn("journal: reloaded grants not yet in the store", "file", path, "grants", n, "keys", len(j.batches))
	}
	return nil
}

// apply replays one record into memory; false for a malformed one.
func (j *Journal) apply(line string, maxEpoch *uint64) bool {
	r, err := parseRecord(line)
	if err != nil {
		return false
	}
	*maxEpoch = max(*maxEpoch, r.epoch)
	switch r.kind {
	case 'G':
		j.addLocked(r.epoch, r.policy, r.identity, r.grant)
	case 'S':
		j.putSnapLocked(r.snapshot())
	case 'A':
		k := batchKey{epoch: r.epoch, policy: r.policy.Name + "/" + r.fingerprint, identity: r.identity}
		if b, ok := j.batches[k]; ok {
			j.size -= len(b.grants)
			j.pending -= b.units()
			delete(j.batches, k)
		}
	}
	return true
}

// maxRecord bounds a record's length; a longer line (a crash can leave a
// zero-filled tail with no newline) is skipped as one corrupt record, and
// reading goes on after its newline.
const maxRecord = 64 << 10

// readRecords calls fn with each line of r without its newline, and with nil
// for a line longer than maxRecord. A last line without a newline (torn by a
// crash) is passed as is: apply refuses it unless it is whole.
func readRecords(r io.Reader, fn func(line []byte)) error {
	br := bufio.NewReaderSize(r, maxRecord)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			fn(nil)
			for errors.Is(err, bufio.ErrBufferFull) { // skip to the newline
				_, err = br.ReadSlice('\n')
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
		case errors.Is(err, io.EOF):
			if len(line) > 0 {
				fn(line)
			}
			return nil
		case err != nil:
			return err
		default:
			fn(line[:len(line)-1])
		}
	}
}

// epochNow is the least epoch a journal opened or rotated now may use: the
// clock in µs. Epochs name replay markers in the store, so they must not
// repeat across process lifetimes even when the journal file is lost (a
// memory-only journal, a container without its volume, two processes with
// one instance name): a repeated epoch's batch would be refused as a
// duplicate and its grants silently dropped.
func epochNow() uint64 { return uint64(max(time.Now().UnixMicro(), 1)) }

func policyKey(p ratelimit.Policy) string { return p.Name + "/" + p.Fingerprint() }

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

func (j *Journal) addLocked(epoch uint64, p ratelimit.Policy, id ratelimit.Identity, g ratelimit.Grant) {
	ref := j.refLocked(p)
	k := batchKey{epoch: epoch, policy: ref.key, identity: id}
	b := j.batches[k]
	if b == nil {
		b = &batch{policy: ref}
		j.batches[k] = b
	}
	b.grants = append(b.grants, grant{g.At, g.Cost})
	if p.Algorithm == ratelimit.SlidingWindowLog {
		b.ids = append(b.ids, g.ID)
	}
	j.pending += uint64(g.Cost)
	j.size++
}

// putSnapLocked keeps s as its key's latest snapshot; a key's first counts
// toward the bound.
func (j *Journal) putSnapLocked(s Snapshot) {
	ref := j.refLocked(s.Policy)
	k := snapKey{ref.key, s.Identity}
	if _, ok := j.snaps[k]; !ok {
		j.size++
	}
	j.snaps[k] = snapEntry{policy: ref, state: s.State, valid: s.Valid, n: s.N, confirmed: s.Confirmed}
}

// snapshotLocked returns the latest snapshot of the key of policy (name and
// fingerprint) and id, or nil.
func (j *Journal) snapshotLocked(policy string, id ratelimit.Identity) *Snapshot {
	s, ok := j.snaps[snapKey{policy, id}]
	if !ok {
		return nil
	}
	return &Snapshot{Policy: s.policy.p, Identity: id, State: s.state, Valid: s.valid, N: s.n, Confirmed: s.confirmed}
}

// Append journals a local grant. It returns ErrFull (the grant is
// counted as overflow) when the journal is full, or the file's write error;
// the grant stays in memory in the second case.
func (j *Journal) Append(p ratelimit.Policy, id ratelimit.Identity, g ratelimit.Grant) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.size >= j.max {
		if j.stats.overflow.Add(uint64(g.Cost)) == uint64(g.Cost) {
			j.log.Error("journal full: local grants are no longer journaled", "max", j.max)
		}
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

// writeLocked appends b to the file. A failed write (a full disk, say) is
// counted and logged, the first and then every 1000th, so grants handed out
// without a durable record show in /status, the metrics and the log; the
// grant stays journaled in memory.
func (j *Journal) writeLocked(b []byte) error {
	if j.f == nil {
		return nil
	}
	j.dirty = true
	if _, err := j.f.Write(b); err != nil {
		if n := j.stats.writeErrors.Add(1); n%1000 == 1 {
			j.log.Error("journal: write failed: local grants are not durable until it succeeds", "err", err, "failed_writes", n)
		}
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

func (j *Journal) writeEpochLocked() {
	if err := j.writeLocked(appendRecord(nil, record{kind: 'E', epoch: j.epoch})); err != nil {
		j.log.Error("journal: write epoch", "err", err)
	}
}

// AppendSnapshot journals what a key's local share started from (before its
// first local grant). It counts toward the journal's bound.
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
// token bucket's or GCRA's, whose replays alone use it).
func (j *Journal) Pending(through uint64) ([]ratelimit.ReplayBatch, []*Snapshot) {
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
	out := make([]ratelimit.ReplayBatch, 0, n)
	snaps := make([]*Snapshot, 0, n)
	all := make([]ratelimit.Grant, 0, grants)
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
		out = append(out, ratelimit.ReplayBatch{Policy: b.policy.p, Identity: k.identity, Marker: m, Grants: all[start:len(all):len(all)]})
		// Only the token bucket's and GCRA's replays net a key's grants
		// against its share's snapshot.
		var snap *Snapshot
		if a := b.policy.p.Algorithm; a == ratelimit.TokenBucket || a == ratelimit.GCRA {
			if s, ok := j.snaps[snapKey{k.policy, k.identity}]; ok {
				held = append(held, Snapshot{Policy: s.policy.p, Identity: k.identity, State: s.state, Valid: s.valid, N: s.n, Confirmed: s.confirmed})
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
func (j *Journal) Ack(batches []ratelimit.ReplayBatch, results []ratelimit.ReplayResult) {
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
			fp = b.Policy.Fingerprint()
			fps[b.Policy] = fp
		}
		k := batchKey{epoch: epoch, policy: b.Policy.Name + "/" + fp, identity: b.Identity}
		held, ok := j.batches[k]
		if !ok {
			continue
		}
		delete(j.batches, k)
		j.size -= len(held.grants)
		j.pending -= held.units()
		if r := results[i]; r.Duplicate {
			j.stats.duplicates.Add(1)
			j.stats.dupUnits.Add(held.units())
		} else {
			if a := b.Policy.Algorithm; a == ratelimit.TokenBucket || a == ratelimit.GCRA {
				// Their folds drop nothing, and the batch may have gone
				// to the store as one charge net of refill (resilient's
				// replay): every grant it held is accounted for.
				r.Replayed, r.Dropped, r.Present = int64(held.units()), 0, 0
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
	if j.size == len(j.snaps) {
		// No grant left: the snapshots and policies go too, and the file
		// starts afresh.
		j.size = 0
		clear(j.snaps)
		clear(j.policies)
		j.lastRef = nil
		if j.f != nil {
			if err := j.f.Truncate(0); err == nil {
				j.writeEpochLocked()
				return
			}
		}
	}
	if len(j.buf) > 0 {
		if err := j.writeLocked(j.buf); err != nil {
			j.log.Error("journal: write ack", "err", err)
		}
	}
}

// Len returns the number of grants held.
func (j *Journal) Len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.size - len(j.snaps)
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
		Pending: j.pending, Corrupt: s.corrupt.Load(), WriteErrors: s.writeErrors.Load(), Epoch: j.epoch,
	}
}

// Each calls fn for every grant held, with the key's snapshot if one was
// journaled (for rebuilding budgets after a restart). fn runs without the
// journal's lock.
func (j *Journal) Each(fn func(p ratelimit.Policy, id ratelimit.Identity, g ratelimit.Grant, s *Snapshot)) {
	type item struct {
		p  ratelimit.Policy
		id ratelimit.Identity
		g  ratelimit.Grant
		s  *Snapshot
	}
	j.mu.Lock()
	var items []item
	for k, b := range j.batches {
		snap := j.snapshotLocked(k.policy, k.identity)
		for _, g := range b.appendTo(nil) {
			items = append(items, item{b.policy.p, k.identity, g, snap})
		}
	}
	j.mu.Unlock()
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(a.g.At, b.g.At) })
	for _, it := range items {
		fn(it.p, it.id, it.g, it.s)
	}
}

// syncLoop fsyncs the file every 100 ms when it was written to.
func (j *Journal) syncLoop() {
	defer close(j.done)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			j.sync()
			return
		case <-t.C:
			j.sync()
		}
	}
}

func (j *Journal) sync() {
	j.mu.Lock()
	f, dirty := j.f, j.dirty
	j.dirty = false
	j.mu.Unlock()
	if f != nil && dirty {
		if err := f.Sync(); err != nil {
			j.log.Error("journal: fsync", "err", err)
		}
	}
}

// Close syncs and closes the file. The grants it holds stay in the file for
// the next start.
func (j *Journal) Close() error {
	select {
	case <-j.stop:
		return nil
	default:
	}
	close(j.stop)
	<-j.done
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}
