// Decisions: in the store while the breaker is closed, locally (from the
// key's share of what the store last said was left) otherwise, and what the
// store's replies teach the limiter (snapshots, clock offset).

package resilient

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/journal"
)

// Decide decides in the store while the breaker is closed, and locally
// otherwise (or when this call fails). It returns an error only for an
// invalid request or a cancelled context.
func (l *Limiter) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	if err := l.prepare(&req); err != nil {
		return ratelimit.Decision{}, err
	}
	id := ratelimit.IdentityOf(req.Key)
	if l.br.State() == Closed {
		req = l.withID(req)
		r := req
		r.Weight = l.weight()
		if d, ok := l.cachedRefusal(l.keyOfIdentity(req.Policy, id), r, r.Weight); ok {
			return d, nil
		}
		if ok, probe := l.br.admit(); ok {
			callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
			sent := l.cfg.Now()
			d, err := l.store.Decide(callCtx, r)
			cancel()
			if probe {
				l.br.done()
			}
			if d, local, err := l.settle(ctx, r, id, d, err, sent, true); !local {
				return d, err
			}
		}
	}
	return l.decideLocal(l.keyOfIdentity(req.Policy, id), id, req), nil
}

// DecideBatch decides several requests as Decide does each, in one round
// trip when the store is a ratelimit.BatchLimiter (redisstore is). A store
// failure counts once against the breaker, however many requests it failed.
func (l *Limiter) DecideBatch(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, []error) {
	ds, errs := make([]ratelimit.Decision, len(reqs)), make([]error, len(reqs))
	reqs = slices.Clone(reqs)
	ids := make([]ratelimit.Identity, len(reqs))
	pending := make([]int, 0, len(reqs))
	for i := range reqs {
		if errs[i] = l.prepare(&reqs[i]); errs[i] == nil {
			ids[i] = ratelimit.IdentityOf(reqs[i].Key)
			pending = append(pending, i)
		}
	}
	ok, probe := false, false
	w := l.weight()
	if len(pending) > 0 && l.br.State() == Closed {
		asked := pending[:0]
		for _, i := range pending {
			reqs[i] = l.withID(reqs[i])
			r := reqs[i]
			r.Weight = w
			if d, cached := l.cachedRefusal(l.keyOfIdentity(r.Policy, ids[i]), r, w); cached {
				ds[i] = d
				continue
			}
			asked = append(asked, i)
		}
		pending = asked
		if len(pending) > 0 {
			ok, probe = l.br.admit()
		}
	}
	if ok {
		sent := make([]ratelimit.Request, len(pending))
		for j, i := range pending {
			sent[j] = reqs[i]
			sent[j].Weight = w
		}
		callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
		at := l.cfg.Now()
		sds, serrs := ratelimit.DecideAll(callCtx, l.store, sent)
		cancel()
		if probe {
			l.br.done()
		}
		local := make([]int, 0, len(pending))
		counted := false
		for j, i := range pending {
			d, fallback, err := l.settle(ctx, sent[j], ids[i], sds[j], serrs[j], at, !counted)
			if fallback {
				counted = true
				local = append(local, i)
				continue
			}
			ds[i], errs[i] = d, err
		}
		pending = local
	}
	for _, i := range pending {
		ds[i] = l.decideLocal(l.keyOfIdentity(reqs[i].Policy, ids[i]), ids[i], reqs[i])
	}
	return ds, errs
}

// prepare validates req.
func (l *Limiter) prepare(req *ratelimit.Request) error {
	return req.Validate()
}

// withID gives req an id when it has none, before it goes to the store: one
// id for the store call and, if the call fails, the local grant, so the
// sliding window log counts the request once even if the call still ran
// (and the other algorithms answer a resent request once, lua/once.lua). A
// decision made only locally needs one for the sliding window log alone,
// whose journal keeps it as the member to replay.
func (l *Limiter) withID(req ratelimit.Request) ratelimit.Request {
	if req.ID == "" {
		req.ID = l.idBase + strconv.FormatUint(l.seq.Add(1), 36)
	}
	return req
}

// settle takes the store's answer (d, err) to req, sent at sent: a decision
// is remembered and returned, an invalid request or a cancelled caller
// returned as an error, and any other failure counted (against the breaker
// too when countFailure is set) and reported as local: decide it locally.
func (l *Limiter) settle(ctx context.Context, req ratelimit.Request, id ratelimit.Identity, d ratelimit.Decision, err error, sent time.Time, countFailure bool) (_ ratelimit.Decision, local bool, _ error) {
	switch {
	case err == nil:
		l.br.success()
		l.stats.storeDecisions.Add(1)
		l.remember(l.keyOfIdentity(req.Policy, id), req, id, d, sent, l.cfg.Now())
		return d, false, nil
	case errors.Is(err, ratelimit.ErrInvalidRequest) || errors.Is(err, ratelimit.ErrInvalidPolicy):
		return ratelimit.Decision{}, false, err
	case ctx.Err() != nil:
		return ratelimit.Decision{}, false, ctx.Err()
	}
	l.stats.failures.Add(1)
	l.stats.failedDecisions.Add(1)
	if countFailure && !errors.Is(err, ratelimit.ErrBadReply) { // one odd key is no outage
		l.br.failure(err.Error(), isTimeout(err))
	}
	return ratelimit.Decision{}, true, nil
}

func (l *Limiter) decideLocal(k key, id ratelimit.Identity, req ratelimit.Request) ratelimit.Decision {
	l.stats.localDecisions.Add(1)
	p := req.Policy
	if p.Algorithm == ratelimit.SlidingWindowLog {
		req = l.withID(req)
	}
	now := l.storeNow()
	var d ratelimit.Decision
	switch p.OnFailure() {
	case ratelimit.FailOpen:
		d = ratelimit.Decision{Allowed: true, Limit: p.Capacity(), Remaining: p.Capacity(), Mode: ratelimit.ModeOpen}
	case ratelimit.FailClosed:
		return ratelimit.Decision{Limit: p.Capacity(), RetryAfter: l.cfg.ProbeInterval, ResetAfter: l.cfg.ProbeInterval, Mode: ratelimit.ModeClosed}
	default:
		part := share{n: float64(l.fleetSize()), factor: p.Factor(), confirmed: l.confirmedAt()}
		sh := l.keys.shard(k)
		sh.mu.Lock()
		e := sh.entry(k)
		d = e.decideLocal(p, now, req.Units(), part)
		if d.Allowed && !req.ReadOnly && !e.journaled {
			// What this share started from, before its first grant, so a
			// restart rebuilds it.
			e.journaled = true
			_ = l.journal.AppendSnapshot(journal.Snapshot{Policy: p, Identity: id, State: e.snap, Valid: e.snapValid, N: e.n, Confirmed: e.confirmed})
		}
		sh.mu.Unlock()
	}
	if d.Allowed && !req.ReadOnly {
		// Journaled before the response is sent; a full journal or a
		// failed write is counted and logged by the journal itself. A
		// read-only request took nothing.
		_ = l.journal.Append(p, id, ratelimit.Grant{At: now, Cost: req.Units(), ID: req.ID})
	}
	return d
}

// remember keeps the store's reply as the key's snapshot and updates the
// clock offset (the reply's time is taken as the middle of the round trip).
func (l *Limiter) remember(k key, req ratelimit.Request, id ratelimit.Identity, d ratelimit.Decision, sent, recv time.Time) {
	p := req.Policy
	l.learnOffset(d.State.Now, sent, recv)
	sh := l.keys.shard(k)
	sh.mu.Lock()
	e := sh.entry(k)
	e.snap, e.snapValid = d.State, true
	e.refusedUntil = 0
	if !d.Allowed && d.RetryAfter > 0 && exactRetry(p.Algorithm) {
		e.refusedUntil = d.State.Now + d.RetryAfter.Microseconds()
		e.refusedCost, e.refusedW = req.Units(), req.Weight
	}
	if e.policy == nil || *e.policy != p {
		e.policy = l.keys.policyRef(p)
	}
	e.identity = id
	e.version++
	sh.mu.Unlock()
}

// exactRetry reports whether an algorithm's RetryAfter is exact: no request
// of the same cost can be admitted before it by any instance, because only
// more use can happen meanwhile (the token bucket and GCRA refill at a fixed
// rate; the log's oldest entry expires at a fixed time).
func exactRetry(a ratelimit.Algorithm) bool {
	return a == ratelimit.TokenBucket || a == ratelimit.GCRA || a == ratelimit.SlidingWindowLog
}

// refusalMargin is how much earlier than the store said a cached refusal
// ends, on top of the error of the estimate of the store's clock (half the
// round trip it was learned from): a request the store would admit must not
// be refused.
const refusalMargin = 2 * time.Millisecond

// cachedRefusal answers req from the store's last refusal of its key, when
// that refusal still holds exactly (see entry.refusedUntil): same policy, at
// least the refused cost, a weight at least as strict (w, the weight the
// store call would carry), and the retry time not yet reached.
func (l *Limiter) cachedRefusal(k key, req ratelimit.Request, w ratelimit.Weight) (ratelimit.Decision, bool) {
	now := l.storeNow()
	sh := l.keys.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.lru.Peek(k)
	if !ok || e.refusedUntil == 0 || e.policy == nil || *e.policy != req.Policy || req.Units() < e.refusedCost ||
		!atLeastAsStrict(w, e.refusedW) {
		return ratelimit.Decision{}, false
	}
	margin := refusalMargin.Microseconds() + l.offsetErr.Load()
	left := e.refusedUntil - now - margin
	if left <= 0 {
		return ratelimit.Decision{}, false
	}
	l.stats.cachedRefusals.Add(1)
	reset := max(time.Duration(left)*time.Microsecond, time.Duration(e.snap.Now-now)*time.Microsecond)
	return ratelimit.Decision{Limit: req.Policy.Capacity(), RetryAfter: time.Duration(left+margin) * time.Microsecond,
		ResetAfter: reset, State: e.snap, Mode: ratelimit.ModeRedis}, true
}

// atLeastAsStrict reports whether weight w holds back at least as much as
// was (a zero Weight is 1/1).
func atLeastAsStrict(w, was ratelimit.Weight) bool {
	num, den := max(w.Num, 1), max(w.Den, 1)
	wnum, wden := max(was.Num, 1), max(was.Den, 1)
	return num*wden >= wnum*den
}

// learnOffset records the store's clock, read at storeNow between sent and
// recv: the reply's time is taken as the middle of the round trip. Both
// decisions and heartbeats teach it, so the offset is known from the first
// heartbeat and follows a local clock that steps.
func (l *Limiter) learnOffset(storeNow int64, sent, recv time.Time) {
	if storeNow <= 0 {
		return
	}
	mid := sent.UnixMicro() + recv.Sub(sent).Microseconds()/2
	l.offset.Store(storeNow - mid)
	l.offsetErr.Store(recv.Sub(sent).Microseconds()/2 + 1)
}

func (l *Limiter) keyOfIdentity(p ratelimit.Policy, id ratelimit.Identity) key {
	return l.seeds.Key(p, id)
}

// confirmedAt is when (store µs) the other instances hold this one's share
// back: they count it as missing HeartbeatTTL after its last heartbeat, and
// hold it back from the second of their heartbeats that finds it missing
// (setFleet).
func (l *Limiter) confirmedAt() int64 {
	beat := l.lastBeat.Load()
	if beat == 0 {
		return 0 // never in the fleet's view: nobody decides unaware of it
	}
	return beat + l.offset.Load() + (l.cfg.HeartbeatTTL + 2*l.cfg.HeartbeatInterval).Microseconds()
}

// storeNow estimates the store's clock in µs.
func (l *Limiter) storeNow() int64 { return l.cfg.Now().UnixMicro() + l.offset.Load() }

// fleetSize is the number of instances that may be granting: live and
// suspect, as the last heartbeat said; ExpectedInstances before the first.
func (l *Limiter) fleetSize() int64 {
	if !l.fleetSeen.Load() {
		return int64(l.cfg.ExpectedInstances)
	}
	return max(1, l.live.Load()+l.suspect.Load())
}

// weight holds back the shares of suspect instances in store decisions.
func (l *Limiter) weight() ratelimit.Weight {
	live, suspect := l.live.Load(), l.heldBack.Load()
	if suspect <= 0 || live <= 0 {
		return ratelimit.Weight{}
	}
	return ratelimit.Weight{Num: min(live+suspect, 1024), Den: min(live, 1024)}
}
