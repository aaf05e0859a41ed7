// The journal's counters (Stats): what became of every unit it was given.

package journal

import (
	"fmt"
	"sync/atomic"
)

type counters struct {
	granted, reloaded, overflow          atomic.Uint64
	replayed, dropped, present, dupUnits atomic.Uint64
	duplicates, corrupt, writeErrors     atomic.Uint64
}

// Stats are the journal's counters, in units (a grant of cost 3 is 3),
// since this process started (Reloaded: found in the file at start).
// Granted + Reloaded = Replayed + Present + Dropped + DuplicateUnits +
// Pending; Overflow grants were refused because the journal was full.
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
	// Doubts are the grants held that wait for the store's late reply.
	Doubts      int    `json:"doubts"`
	Corrupt     uint64 `json:"corrupt_lines"`
	WriteErrors uint64 `json:"write_errors"`
	Epoch       uint64 `json:"epoch"`
	// Held is how many grants and snapshots the journal holds, of at most
	// Max: a full journal refuses local grants (Overflow).
	Held int `json:"held"`
	Max  int `json:"max"`
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
