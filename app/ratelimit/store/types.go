package store

import (
	"crypto/sha256"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// Identity is the SHA-256 of a client identity. Stores and journals keep it
// instead of the identity itself: fixed length, and no client key on disk.
type Identity [32]byte

// IdentityOf hashes a client identity.
func IdentityOf(key string) Identity { return sha256.Sum256([]byte(key)) }

// Grant is one request granted locally while the store was out, in the
// store's clock.
type Grant struct {
	At   int64 // µs since the epoch, store time
	Cost int64
	ID   string // the request id (the sliding window log's member)
}

// ReplayBatch is every journaled grant of one key from one outage epoch of
// one instance. Marker names the batch ("<instance>:<epoch>"): the store
// applies a batch at most once, however often it is sent.
type ReplayBatch struct {
	Policy   ratelimit.Policy
	Identity Identity
	Marker   string
	Grants   []Grant
	// ResetsRead is the store time (µs) of the sender's last read of the
	// fleet's reset log, every reset read then applied to its journal
	// (journal.Journal.Drop). A store that keeps resets refuses, with
	// ErrFenced, a batch of a key reset after it: its grants from before
	// that reset would bring back the usage the reset lifted.
	ResetsRead int64
}

// ReplayResult says what the store did with a batch.
type ReplayResult struct {
	// Replayed units were added to the key's state; Dropped units were
	// too old to matter (outside the window, or older than a full refill).
	Replayed, Dropped int64
	// Present units were already there: sliding window log members with
	// the same request id (a decision that timed out but still ran).
	Present int64
	// Duplicate: the batch had been applied already, so nothing was.
	Duplicate bool
	// DuplicateUnits were already applied by an earlier send of the same
	// batch (all of its units when Duplicate; some of them when a backend
	// applies a batch in several steps and an earlier send got part-way).
	DuplicateUnits int64
}

// Fleet is a shared store's view of the fleet of instances sharing it, as
// a heartbeat returns it.
type Fleet struct {
	// Live instances heartbeat within the TTL (the caller included);
	// Suspect ones are missing for less than the lease grace (possibly cut
	// off from the store and spending their fallback share).
	Live, Suspect int
	// Generation changes when the store loses its data.
	Generation string
	// Now is the store's clock when it answered, in Unix µs.
	Now int64
	// Stages are the recovery stages the live instances last wrote with
	// their heartbeats ("" for one that wrote none), for a store that
	// keeps them (see Stager).
	Stages []string
}
