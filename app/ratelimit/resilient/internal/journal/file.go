// The journal's file: opening and reloading it, appending to it, and
// syncing it.

package journal

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

const journalFile = "journal.log"

// Open opens (or creates) the journal in dir, reloading the grants it
// holds; dir "" keeps the journal in memory only. max bounds the grants
// and snapshots held (0: one million).
func Open(dir, instance string, max int, logger *slog.Logger) (*Journal, error) {
	if max <= 0 {
		max = 1_000_000
	}
	if logger == nil {
		logger = slog.Default()
	}
	j := &Journal{instance: instance, max: max, log: logger, batches: map[batchKey]*batch{}, keys: map[snapKey]*keyEntry{},
		epochs: map[uint64]int{}, doubts: map[string]*doubt{}, policies: map[ratelimit.Policy]*policyRef{}, epoch: epochNow(),
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
	j.settleDoubtsLocked()
	j.mu.Unlock()
	go j.syncLoop()
	return j, nil
}

// load reads the file at path into memory, then cuts off a last line
// without its newline (torn by a crash): appended to, it would merge with
// the next record.
func (j *Journal) load(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	var maxEpoch uint64
	whole, err := readRecords(f, func(line []byte) {
		if line == nil || !j.apply(string(line), &maxEpoch) {
			j.stats.corrupt.Add(1)
		}
	})
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("journal: read %s: %w", path, err)
	}
	if err := truncateTo(path, whole); err != nil {
		return fmt.Errorf("journal: cut the torn end of %s: %w", path, err)
	}
	j.epoch = max(maxEpoch+1, epochNow())
	for _, b := range j.batches {
		j.stats.reloaded.Add(b.units())
	}
	for _, d := range j.doubts {
		j.stats.reloaded.Add(uint64(d.grant.cost))
	}
	if n := j.stats.corrupt.Load(); n > 0 {
		j.log.Warn("journal: skipped unreadable lines", "file", path, "lines", n)
	}
	if n := j.grants; n > 0 {
		j.log.Warn("journal: reloaded grants not yet in the store", "file", path, "grants", n, "keys", len(j.keys))
	}
	return nil
}

// truncateTo cuts the file at path to n bytes when it is longer.
func truncateTo(path string, n int64) error {
	st, err := os.Stat(path)
	if err != nil || st.Size() <= n {
		return err
	}
	return os.Truncate(path, n)
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
	case 'D':
		j.addDoubtLocked(r.policy, r.identity, r.grant)
	case 'R':
		// A doubt whose record was lost (a damaged line) cannot be
		// resolved: nothing to do.
		j.resolveLocked(r.grant.ID, r.present, r.epoch)
	case 'S':
		j.putSnapLocked(r.snapshot())
	case 'A':
		k := batchKey{epoch: r.epoch, policy: r.policy.Name + "/" + r.fingerprint, identity: r.identity}
		if b, ok := j.batches[k]; ok {
			j.dropBatchLocked(k, b)
		}
	case 'X':
		pk := r.policy.Name + "/" + r.fingerprint
		for epoch := range j.epochs {
			k := batchKey{epoch: epoch, policy: pk, identity: r.identity}
			if b, ok := j.batches[k]; ok {
				j.dropThroughLocked(k, b, r.grant.At)
			}
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
// crash) is passed as is: its checksum refuses it. It returns how many bytes
// of r end in a newline: the part to keep.
func readRecords(r io.Reader, fn func(line []byte)) (int64, error) {
	br := bufio.NewReaderSize(r, maxRecord)
	var whole int64
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			fn(nil)
			n := int64(len(line))
			for errors.Is(err, bufio.ErrBufferFull) { // skip to the newline
				line, err = br.ReadSlice('\n')
				n += int64(len(line))
			}
			if errors.Is(err, io.EOF) {
				return whole, nil
			}
			if err != nil {
				return whole, err
			}
			whole += n
		case errors.Is(err, io.EOF):
			if len(line) > 0 {
				fn(line)
			}
			return whole, nil
		case err != nil:
			return whole, err
		default:
			whole += int64(len(line))
			fn(bytes.TrimSuffix(line, []byte{'\n'}))
		}
	}
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
