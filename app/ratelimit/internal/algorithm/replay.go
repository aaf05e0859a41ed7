package algorithm

import (
	"sort"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// clampGrant moves a grant stamped after now to now. A local clock that
// stepped ahead, or a restart during an outage before the store's clock
// was learned, can stamp grants minutes ahead; folded in as stamped, one
// such grant would lock its key until that time. Every replay clamps.
func clampGrant(g store.Grant, now int64) store.Grant {
	if now > 0 && g.At > now {
		g.At = now
	}
	return g
}

// SortGrants orders grants by time (replays fold them in order).
func SortGrants(g []store.Grant) {
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
func TokenBucketReplay(p ratelimit.Policy, s TokenBucketState, now int64, grants []store.Grant) (TokenBucketState, store.ReplayResult) {
	w, rate := p.Window.Microseconds(), p.Limit
	capScaled := p.Capacity() * w
	var r store.ReplayResult
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
func GCRAReplay(p ratelimit.Policy, s GCRAState, now int64, grants []store.Grant) (GCRAState, store.ReplayResult) {
	w, rate := p.Window.Microseconds(), p.Limit
	var r store.ReplayResult
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
func WindowCounterReplay(p ratelimit.Policy, s WindowCounterState, now int64, grants []store.Grant) (WindowCounterState, store.ReplayResult) {
	w := p.Window.Microseconds()
	start := now - now%w
	cur, prev := s.Shift(start, w)
	var r store.ReplayResult
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
func WindowLogReplay(p ratelimit.Policy, l *WindowLog, now int64, grants []store.Grant) store.ReplayResult {
	w := p.Window.Microseconds()
	var r store.ReplayResult
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
