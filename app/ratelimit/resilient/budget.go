package resilient

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient/internal/journal"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// entry is what one instance knows of one key: the last decision the store
// made for it (a snapshot of the algorithm state in the store's clock) and
// the local fallback state that continues from it while the store is out.
type entry struct {
	// The last store reply, and the key it was for.
	snap      contract.State
	snapValid bool
	policy    *ratelimit.Policy // shared by the keys of the policy (policyRef)
	identity  store.Identity
	version   uint64 // bumped by every reply

	// A refusal the store answered: until refusedUntil (store µs) no
	// request of at least refusedCost units, at a weight at least as strict,
	// can be admitted by any instance (only more use can happen), so such a
	// request is refused without a round trip. 0: none.
	refusedUntil int64
	refusedCost  int64
	refusedW     contract.Weight
	// The refusal's resend hint (contract.Decision.ResendID): a request
	// with this id is a resend the store admits until resendUntil (store
	// µs), so the refusal does not answer it.
	resendID    string
	resendUntil int64

	// Local state; valid while localVersion == version.
	localVersion uint64
	localInit    bool
	localClosed  bool    // started with the breaker closed: no refill (decideLocal)
	level        float64 // token bucket and GCRA: units left in this instance's share
	at           int64   // µs (store time) of level
	confirmed    int64   // share.confirmed when the local state began (see share)
	n            float64 // share.n when the local state began
	journaled    bool    // the start of the local state is in the journal
	// syncedUnits are units the store took (a replay, a late reply that
	// found them counted) at store time syncedAt, later than the
	// snapshot: a fresh share counts them until a reply that recent.
	syncedUnits, syncedAt int64
	log                   algorithm.WindowLog
	wc                    algorithm.WindowCounterState
}

// share is this instance's part of the fleet's remaining quota.
type share struct {
	n      float64 // instances that may be granting: live + suspect
	factor float64 // the policy's fallback factor
	// confirmed is when (store time, µs) the other instances hold this
	// one's share back: its last heartbeat plus the heartbeat TTL and two
	// intervals (confirmedAt). Until then they decide in Redis without holding its share
	// back, and may take capacity that frees up meanwhile (refill, grants
	// ageing out); the local share does not count that capacity.
	confirmed int64
	// weight is what this instance's store calls hold back for the
	// others held back (decide.go, weight): the store refuses past the
	// limit that leaves, and what it shows used is of that limit.
	weight contract.Weight
}

func (s share) of(x float64) float64 { return x * s.factor / s.n }

// free is this instance's part of what a window algorithm's limit leaves
// when used of it is taken (used and the result in units × scale): a share
// of the rest or, with others held back, a part of what the store's
// held-back limit leaves among the instances deciding in it (the held-back
// ones have their shares of the rest). A share of the whole limit granted
// what the store, deciding with the weight, refused to every caller, or
// had left to the held-back ones (chaos redis-slow, two of four instances
// out).
func (s share) free(limit int64, used, scale float64) float64 {
	if s.weight == (contract.Weight{}) {
		return s.of(float64(limit)*scale - used)
	}
	held := limit * s.weight.Den / s.weight.Num // the scripts' limit (algorithm.limitOf)
	return (float64(held)*scale - used) * s.factor / float64(s.weight.Den)
}

// decideLocal decides from the local budget at store time now (µs): this
// instance's share of what the store last said was left, with refill and
// ageing that mirror the store's semantics. The caller has started the
// local state (ensureLocal).
func (e *entry) decideLocal(p ratelimit.Policy, now, cost int64, sh share) contract.Decision {
	// The fleet size is the one the share started with (after a restart:
	// the one the journal recorded), not the one assumed since.
	sh.n = e.n
	var d contract.Decision
	switch p.Algorithm {
	case ratelimit.TokenBucket, ratelimit.GCRA:
		d = e.bucket(p, now, cost, sh)
	case ratelimit.SlidingWindowLog:
		d = e.windowLog(p, now, cost, sh)
	case ratelimit.SlidingWindowCounter:
		d = e.windowCounter(p, now, cost, sh)
	}
	d.Limit = p.Capacity()
	d.Mode = ratelimit.ModeLocal
	d.State.Now = now
	return d
}

// needsLocal reports whether the local state must be (re)started for a
// decision with the breaker closed or not: it never was, a store reply
// came since it was, or it was started with the breaker the other way.
func (e *entry) needsLocal(closed bool) bool {
	return !e.localInit || e.localVersion != e.version || e.localClosed != closed
}

// ensureLocal starts the local state from the latest snapshot when it
// needs to (needsLocal), and charges it with hidden units: grants the
// store does not have, which the snapshot cannot show (this instance's
// grants not yet replayed, or replayed after the snapshot was taken).
// Without them every store reply between two local decisions started a
// fresh share, and the grants of the one before were forgotten
// (TestGrayFailureKeepsTheShare).
func (e *entry) ensureLocal(p ratelimit.Policy, now int64, sh share, closed bool, hidden func() int64) {
	if !e.needsLocal(closed) {
		return
	}
	e.initLocal(p, now, sh)
	e.localClosed = closed
	if n := hidden(); n > 0 {
		e.absorb(p, store.Grant{At: now, Cost: n})
	}
}

// startFrom starts the local state of policy p for identity id from a
// journaled snapshot (nil: none, and n instances assumed): what an earlier
// process, or this one before it forgot the key, started the share from.
func (e *entry) startFrom(p ratelimit.Policy, id store.Identity, s *journal.Snapshot, n float64) {
	sh := share{n: n, factor: fallbackFactor(p)}
	if s != nil {
		sh.n, sh.confirmed = s.N, s.Confirmed
		if s.Valid {
			e.snap, e.snapValid, e.version = s.State, true, e.version+1
		}
	}
	e.identity = id
	at := int64(0)
	if s != nil {
		at = s.State.Now
	}
	e.initLocal(p, at, sh)
}

// charge applies a grant made before the key was forgotten (reloaded from
// the journal after a restart or an eviction) to the local state, whether
// or not it fits. The local state must be started (startFrom).
func (e *entry) charge(p ratelimit.Policy, g store.Grant) { e.absorb(p, g) }

// absorb takes g from the local state at its time, whether or not it fits.
func (e *entry) absorb(p ratelimit.Policy, g store.Grant) {
	sh := share{n: e.n, factor: fallbackFactor(p), confirmed: e.confirmed}
	switch p.Algorithm {
	case ratelimit.TokenBucket, ratelimit.GCRA:
		e.bucket(p, g.At, 0, sh) // refill up to the grant's time
		e.level -= float64(g.Cost)
	case ratelimit.SlidingWindowLog:
		algorithm.WindowLogReplay(p, &e.log, g.At, []store.Grant{g})
	case ratelimit.SlidingWindowCounter:
		e.wc, _ = algorithm.WindowCounterReplay(p, e.wc, g.At, []store.Grant{g})
	}
}

func (e *entry) initLocal(p ratelimit.Policy, now int64, sh share) {
	e.localInit, e.localVersion = true, e.version
	// Fixed for this outage: a heartbeat during recovery must not move it.
	e.confirmed, e.n, e.journaled = sh.confirmed, sh.n, false
	e.log = algorithm.WindowLog{}
	e.wc = algorithm.WindowCounterState{}
	w := float64(p.Window.Microseconds())
	// Refill from the snapshot on (without one: a full share, from now),
	// but not before the others can know: with the breaker closed never
	// (confirmed is then the end of time), since the store goes on
	// deciding for the others (TestLateGrantOfAnUnseenKeyIsChargedInFull).
	e.level, e.at = sh.of(float64(p.Capacity())), max(now, sh.confirmed)
	if !e.snapValid {
		return
	}
	switch p.Algorithm {
	case ratelimit.TokenBucket:
		e.level, e.at = sh.of(float64(e.snap.Tokens)/w), max(e.snap.Now, sh.confirmed)
	case ratelimit.GCRA:
		ahead := float64(e.snap.TAT-e.snap.Now)*float64(p.Limit) + float64(e.snap.TATRem)
		avail := (float64(p.Capacity())*w - max(0, ahead)) / w
		e.level, e.at = sh.of(max(0, avail)), max(e.snap.Now, sh.confirmed)
	}
}

// bucket is the token bucket (and GCRA, its equivalent) share: capacity and
// rate divided among the instances, starting from the share of the tokens
// left at the last reply.
func (e *entry) bucket(p ratelimit.Policy, now, cost int64, sh share) contract.Decision {
	capacity := sh.of(float64(p.Capacity()))
	rate := sh.of(float64(p.Limit) / float64(p.Window.Microseconds())) // units per µs
	e.level, e.at = fill(e.level, e.at, now, capacity, rate), max(e.at, now)
	var d contract.Decision
	c := float64(cost)
	if e.level+1e-9 >= c {
		d.Allowed = true
		e.level = max(0, e.level-c)
	} else {
		d.RetryAfter = microsCeil((c - e.level) / rate)
	}
	d.Remaining = int64(math.Floor(e.level + 1e-9))
	d.ResetAfter = microsCeil((capacity - e.level) / rate)
	return d
}

// windowLog is the sliding window log share. The grants the last reply knew
// of age out as its histogram said (each bucket assumed to expire as late as
// it could); the instance may hold its share of the rest of the window.
func (e *entry) windowLog(p ratelimit.Policy, now, cost int64, sh share) contract.Decision {
	w := p.Window.Microseconds()
	var pre int64
	if e.snapValid {
		for i, n := range e.snap.Ages {
			// Bucket i leaves the window at the latest at expiry. If that
			// is before the others can know this instance is missing, one
			// of them may have taken the freed place: it stays taken for
			// a window more.
			expiry := e.snap.Now + w - int64(i)*w/contract.AgeBuckets
			if expiry > now || expiry <= e.confirmed && expiry+w > now {
				pre += n
			}
		}
	}
	local := p
	local.Limit = int64(math.Floor(max(0, sh.free(p.Limit, float64(pre), 1)) + 1e-9))
	return algorithm.WindowLogDecide(local, &e.log, now, cost, contract.Weight{})
}

// windowCounter is the sliding window counter share: the counts the last
// reply knew of, shifted into the current windows, plus this instance's
// local counts weighted by the number of instances.
func (e *entry) windowCounter(p ratelimit.Policy, now, cost int64, sh share) contract.Decision {
	w := p.Window.Microseconds()
	start := now - now%w
	elapsed := now - start
	var known, kc, kp int64
	if e.snapValid {
		snap := algorithm.WindowCounterState{WindowStart: e.snap.WindowStart, Current: e.snap.Current, Previous: e.snap.Previous}
		kc, kp = snap.Shift(start, w)
		known = counterLoad(snap, now, w)
		// What the known counts shed by ageing before the others hold
		// this share back (with the breaker closed: never, the store goes
		// on deciding) the store may have granted to them: it stays taken
		// until their grants have left the windows too (two windows on).
		// Credited, a counter key behind a slow Redis was granted its
		// ageing twice, locally and by the store (chaos redis-slow).
		from, until := e.snap.Now, min(now, e.confirmed)
		if until > from && start < until-until%w+2*w {
			known += counterLoad(snap, from, w) - counterLoad(snap, until, w)
		}
	}
	lc, lp := e.wc.Shift(start, w)
	room := sh.free(p.Limit, float64(known), float64(w)) // this instance's part, units × µs
	used := float64(lp*(w-elapsed) + lc*w)
	var d contract.Decision
	if used+float64(cost*w) <= room+1e-6 {
		d.Allowed = true
		lc += cost
		used += float64(cost * w)
	} else {
		d.RetryAfter = time.Duration(w-elapsed) * time.Microsecond
	}
	e.wc = algorithm.WindowCounterState{WindowStart: start, Current: lc, Previous: lp}
	d.Remaining = max(0, int64(math.Floor((room-used)/float64(w)+1e-9)))
	if lc > 0 || kc > 0 {
		d.ResetAfter = time.Duration(2*w-elapsed) * time.Microsecond
	} else if lp > 0 || kp > 0 {
		d.ResetAfter = time.Duration(w-elapsed) * time.Microsecond
	}
	return d
}

// counterLoad is what the counts of s weigh at store time t (µs) in a
// window of w µs, in units × µs: the previous window's count by what is
// left of that window, the current one's in full.
func counterLoad(s algorithm.WindowCounterState, t, w int64) int64 {
	start := t - t%w
	cur, prev := s.Shift(start, w)
	return prev*(w-(t-start)) + cur*w
}

// netOfRefill returns what a token bucket or GCRA key's grants took from
// this instance's share in an outage, net of the refill the share would
// have thrown away at its capacity without them: the level of the share
// left unused minus its level with the grants, both at now (store µs; the
// last grant when that is later), which is also the time returned. Both
// start empty (or in the debt the snapshot showed) when the share started
// (the snapshot's time, or the other instances' confirmation), not at the
// level the snapshot showed: a stale snapshot may show tokens that others
// took since, and crediting refill against them would erase usage. ok is
// false when the snapshot cannot say (no fleet size in it).
//
// Charging this once, at now, into the store's state refilled to it is
// order-free across instances when every instance charges at the same now
// (the fleet's cutoff, chargeTimes), and never leaves the store above one
// bucket fed every grant in time order: shares that start empty and cap at
// their part of the capacity waste at least the refill that bucket would.
// Folding the grants themselves, instance after instance, would charge
// every grant older than the state the previous replays left without
// refill, an overcharge that grows with the outage (TestReplayIsNetOfRefill). A key that expired in the store
// during the outage (full by then without use) starts full, as the unused
// share ends.
//
// Why at now and not at the last grant: the store refills one bucket at the
// whole rate, a share at its part of it. A charge dated at its last grant
// would be refilled by the store at the whole rate from then on, while the
// other instances' shares went on refilling (and granting) at their parts
// until their own last grants, which their charges already count: the same
// refill credited twice, the rate over a share times the spread of the last
// grants (TestChargesLeaveNoMoreThanTheIdeal). Dated now, a charge has decayed only at its
// share's rate, and the store's refill starts when the store knows of it.
//
// It sorts grants in place.
func netOfRefill(p ratelimit.Policy, s journal.Snapshot, grants []store.Grant, now int64) (at int64, units float64, ok bool) {
	if len(grants) == 0 || !(s.N >= 1) || math.IsInf(s.N, 0) {
		return 0, 0, false
	}
	sorted := grants // sorted in place: the caller's own copy
	slices.SortFunc(sorted, func(a, b store.Grant) int { return cmp.Compare(a.At, b.At) })
	sh := share{n: s.N, factor: fallbackFactor(p), confirmed: s.Confirmed}
	e := entry{snap: s.State, snapValid: s.Valid}
	e.initLocal(p, sorted[0].At, sh)
	e.level = min(0, e.level)
	capacity := sh.of(float64(p.Capacity()))
	rate := sh.of(float64(p.Limit) / float64(p.Window.Microseconds()))
	at = max(now, sorted[len(sorted)-1].At)
	unused := fill(e.level, e.at, at, capacity, rate)
	level, t := e.level, e.at
	for _, g := range sorted {
		// No floor at zero: a grant older than the share's start (an
		// earlier outage of the same epoch) is charged in full.
		level, t = fill(level, t, g.At, capacity, rate), max(t, g.At)
		level -= float64(g.Cost)
	}
	level = fill(level, t, at, capacity, rate)
	return at, max(0, unused-level), true
}

// fill refills a share's level from one time (µs) to a later one at rate,
// up to capacity; a later from leaves it as it is.
func fill(level float64, from, to int64, capacity, rate float64) float64 {
	if to > from {
		return min(capacity, level+float64(to-from)*rate)
	}
	return level
}

func microsCeil(us float64) time.Duration {
	if us <= 0 || math.IsNaN(us) {
		return 0
	}
	if us > float64(math.MaxInt64/1000) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(math.Ceil(us)) * time.Microsecond
}
