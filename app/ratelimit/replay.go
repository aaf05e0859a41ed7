package ratelimit

import (
	"crypto/sha256"
	"sort"
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
	Policy   Policy
	Identity Identity
	Marker   string
	Grants   []Grant
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
}

// clampGrant moves a grant stamped after now to now. A local clock that
// stepped ahead, or a restart during an outage before the store's clock
// was learned, can stamp grants minutes ahead; folded in as stamped, one
// such grant would lock its key until that time. Every replay clamps.
func clampGrant(g Grant, now int64) Grant {
	if now > 0 && g.At > now {
		g.At = now
	}
	return g
}

// SortGrants orders grants by time (replays fold them in order).
func SortGrants(g []Grant) {
	sort.SliceStable(g, func(i, j int) bool { return g[i].At < g[j].At })
}

// The replay transitions: (policy, state, now, grants) -> (state, result),
// twins of the replay scripts in redisstore. Grants must be sorted by time.
//
// Token bucket and GCRA fold the grants in time order: each grant later than
// the state's last update first refills (drains) the bucket up to its time;
// a grant earlier than it (another instance's replay, or store decisions
// since recovery, came first) is charged without refill. So refill is never
// counted once per grant (the error of replaying each grant as a fresh
// decision), and usage is never erased: a capped simulation that leaves out
// consumption B ends at most ΣB higher, so charging B afterwards never ends
// above the ideal limiter that saw every grant in order. The error is an
// overcharge, at most the units charged without refill (in a fleet-wide
// outage: the grants of every instance but the first to replay, bounded by
// the refill during the outage). No grant is dropped: whether an old grant
// still matters depends on what followed it, which the fold accounts for.

// TokenBucketReplay folds grants into a token bucket state.
func TokenBucketReplay(p Policy, s TokenBucketState, now int64, grants []Grant) (TokenBucketState, ReplayResult) {
	w, rate := p.WindowMicros(), p.Limit
	capScaled := p.Capacity() * w
	var r ReplayResult
	for _, g := range grants {
		g = clampGrant(g, now)
		if s.Last == 0 {
			s = TokenBucketState{Tokens: capScaled, Last: g.At}
		}
		if g.At > s.Last {
			s.Tokens = tokenBucketFill(s.Tokens, g.At-s.Last, capScaled, rate)
			s.Last = g.At
		}
		s.Tokens -= g.Cost * w
		r.Replayed += g.Cost
	}
	return s, r
}

// GCRAReplay folds grants into a GCRA state.
func GCRAReplay(p Policy, s GCRAState, now int64, grants []Grant) (GCRAState, ReplayResult) {
	w, rate := p.WindowMicros(), p.Limit
	var r ReplayResult
	for _, g := range grants {
		g = clampGrant(g, now)
		if s.TAT < g.At {
			s = GCRAState{TAT: g.At}
		}
		inc := g.Cost * w
		s.TAT += inc / rate
		s.Rem += inc % rate
		if s.Rem >= rate {
			s.TAT++
			s.Rem -= rate
		}
		r.Replayed += g.Cost
	}
	return s, r
}

// WindowCounterReplay adds grants to the counts of their windows: the
// current one (or a later one, for a clock slightly ahead) or the one before;
// older grants are dropped.
func WindowCounterReplay(p Policy, s WindowCounterState, now int64, grants []Grant) (WindowCounterState, ReplayResult) {
	w := p.WindowMicros()
	start := now - now%w
	cur, prev := s.Shift(start, w)
	var r ReplayResult
	for _, g := range grants {
		g = clampGrant(g, now)
		switch gs := g.At - g.At%w; {
		case gs >= start:
			cur += g.Cost
		case gs == start-w:
			prev += g.Cost
		default:
			r.Dropped += g.Cost
			continue
		}
		r.Replayed += g.Cost
	}
	return WindowCounterState{WindowStart: start, Current: cur, Previous: prev}, r
}

// WindowLogReplay adds grants to an in-memory log (no request ids: the
// in-memory log cannot tell a grant that is already present; the Redis twin
// can, and counts those as Present). Grants at or before now-Window are
// dropped.
func WindowLogReplay(p Policy, l *WindowLog, now int64, grants []Grant) ReplayResult {
	w := p.WindowMicros()
	var r ReplayResult
	for _, g := range grants {
		g = clampGrant(g, now)
		if g.At <= now-w {
			r.Dropped += g.Cost
			continue
		}
		for range g.Cost {
			i := sort.Search(len(l.times), func(i int) bool { return l.times[i] > g.At })
			l.times = append(l.times, 0)
			copy(l.times[i+1:], l.times[i:])
			l.times[i] = g.At
		}
		r.Replayed += g.Cost
	}
	return r
}
