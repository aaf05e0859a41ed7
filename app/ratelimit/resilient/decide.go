// Decisions: in the store while the breaker is closed (the local path,
// otherwise, is local.go), and what the store's replies teach the limiter
// (snapshots, cached refusals, clock offset, the weight that holds back
// the shares of instances not deciding in the store).

package resilient

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/budget"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/reqid"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// Decide decides in the store while the breaker is closed, and locally
// otherwise (or when this call fails). It returns an error only for an
// invalid request: a caller that goes away (its context ends) still gets
// its request decided and counted, in the store or locally, so that no
// request runs without a counted decision (the store call is bounded by
// Timeout, not by ctx).
func (l *Limiter) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	c := [1]call{{req: contract.Request{Request: req}}}
	l.decide(ctx, c[:])
	return c[0].d.Decision, c[0].err
}

// DecideBatch decides several requests as Decide does each, in one round
// trip when the store is a ratelimit.BatchLimiter (redisstore is). A store
// failure counts once against the breaker, however many requests it failed.
func (l *Limiter) DecideBatch(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, []error) {
	cs := make([]call, len(reqs))
	for i, r := range reqs {
		cs[i].req.Request = r
	}
	l.decide(ctx, cs)
	ds, errs := make([]ratelimit.Decision, len(cs)), make([]error, len(cs))
	for i := range cs {
		ds[i], errs[i] = cs[i].d.Decision, cs[i].err
	}
	return ds, errs
}

// decideWire is DecideBatch with the requests' holds (a lease's draw), and
// the states and weights in the decisions (the extension's DecideWire).
func (l *Limiter) decideWire(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	cs := make([]call, len(reqs))
	for i, r := range reqs {
		cs[i].req = r
		cs[i].req.Weight = contract.Weight{}
	}
	l.decide(ctx, cs)
	ds, errs := make([]contract.Decision, len(cs)), make([]error, len(cs))
	for i := range cs {
		ds[i], errs[i] = cs[i].d, cs[i].err
	}
	return ds, errs
}

// call is one request on its way through decide.
type call struct {
	req contract.Request // validated, and given an id before it goes to the store
	id  store.Identity
	k   key
	w   contract.Weight // what the store call holds back for the fleet (weight)
	d   contract.Decision
	err error
	// late (not zero): the call to the store timed out, and the store
	// still has it; its late answer is awaited until then (decideLocal).
	late  time.Time
	asked bool // sent to the store
	done  bool // d and err are the answer
}

// sent is the request as the store gets it.
func (c *call) sent() contract.Request {
	r := c.req
	r.Weight = c.w
	return r
}

// decide is the one decision sequence of Decide and DecideBatch: validate
// each request; while the breaker is closed, answer it from a cached
// refusal or send it to the store (all of them in one call); decide
// locally each that is left.
func (l *Limiter) decide(ctx context.Context, cs []call) {
	open := 0
	for i := range cs {
		c := &cs[i]
		if c.err = c.req.Validate(); c.err != nil {
			c.done = true
			continue
		}
		c.id = store.IdentityOf(c.req.Key)
		c.k = l.keyOfIdentity(c.req.Policy, c.id)
		open++
	}
	distinctIDs(cs)
	asked := 0
	if open > 0 && l.br.State() == BreakerClosed {
		bucketW, windowW := l.weights() // one fleet view for the whole batch
		for i := range cs {
			c := &cs[i]
			if c.done {
				continue
			}
			c.req = l.withID(c.req)
			c.w = weightFor(c.req.Policy.Algorithm, bucketW, windowW)
			if d, ok := l.cachedRefusal(c.k, c.sent(), c.w); ok {
				c.d, c.done = d, true
				continue
			}
			c.asked = true
			asked++
		}
	}
	if asked > 0 {
		// What is left of the request's time for the store (a lease
		// request that waited for another's draw has spent part of it).
		timeout := l.cfg.Timeout
		if dl, ok := budget.Deadline(ctx); ok {
			timeout = min(timeout, time.Until(dl))
		}
		if timeout < minCall {
			// Nothing left to wait: decided locally, no store failure.
			for i := range cs {
				cs[i].asked = false
			}
		} else if ok, probe := l.br.admit(); ok {
			l.ask(ctx, cs, asked, probe, timeout)
		}
	}
	for i := range cs {
		if c := &cs[i]; !c.done {
			c.d = l.decideLocal(c.k, c.id, c.req, c.late)
		}
	}
}

// minCall is the least time worth a store call: with less left of a
// request's budget, it is decided locally.
const minCall = time.Millisecond

// ask sends the n asked calls of cs to the store in one call, bounded by
// timeout (Timeout, or less: what a request's budget has left), and settles
// each answer; a call the store did not answer is left to be decided
// locally. A call cut short by its budget that times out is not counted
// against the store.
func (l *Limiter) ask(ctx context.Context, cs []call, n int, probe bool, timeout time.Duration) {
	short := timeout < l.cfg.Timeout
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	at := l.clock.now()
	sent := make([]contract.Request, 0, n)
	for i := range cs {
		if cs[i].asked {
			sent = append(sent, cs[i].sent())
		}
	}
	ds, errs := l.wire.DecideWire(callCtx, sent)
	j := 0
	for i := range cs {
		if c := &cs[i]; c.asked {
			c.d, c.err = ds[j], errs[j]
			j++
		}
	}
	cancel()
	if probe {
		l.br.done()
	}
	counted := false // a failed call counts once against the breaker
	for i := range cs {
		c := &cs[i]
		if !c.asked {
			continue
		}
		d, local, err := l.settle(c.k, c.sent(), c.id, c.d, c.err, at, !counted && !(short && (isTimeout(c.err) || errors.Is(c.err, contract.ErrPending))))
		if !local {
			if err == nil && d.Mode == ratelimit.ModeRedis {
				d.Weight = c.w
			}
			c.d, c.err, c.done = d, err, true
			continue
		}
		counted = true
		c.d, c.err = contract.Decision{}, nil
		if l.lateReplies && errors.Is(err, contract.ErrPending) {
			c.late = at.Add(timeout + l.cfg.LateGrace)
		}
	}
}

// distinctIDs gives each request of cs that repeats an earlier one's id
// (one HTTP request's policies share its id) an id of its own: the id
// with "/" and its index, the same for a resend of the same requests. A
// timed-out call's late reply, its doubt in the journal and a refund are
// each the request's by its id: shared, the reply of one policy settled
// another's local grant (a grant the store had refused dropped as counted,
// or a second doubt of the same id refused by the journal, so never
// replayed: TestBatchOfOneIDSettlesEachPolicy).
func distinctIDs(cs []call) {
	// A batch is one request's few policies: a scan of the ones before
	// costs less than a map.
	for i := range cs {
		id := cs[i].req.ID
		if id == "" || cs[i].done {
			continue
		}
		for j := range cs[:i] {
			if !cs[j].done && cs[j].req.ID == id {
				suffix := "/" + strconv.Itoa(i)
				cs[i].req.ID = id[:min(len(id), ratelimit.MaxKeyBytes-len(suffix))] + suffix
				break
			}
		}
	}
}

// withID gives req an id when it has none, before it goes to the store: one
// id for the store call and, if the call fails, the local grant, so the
// sliding window log counts the request once even if the call still ran
// (and the other algorithms answer a resent request once, lua/once.lua). A
// decision made only locally needs one for the sliding window log alone,
// whose journal keeps it as the member to replay.
func (l *Limiter) withID(req contract.Request) contract.Request {
	if req.ID == "" {
		req.ID = l.ids.Next()
	}
	return req
}

// settle takes the store's answer (d, err) to req, sent at sent: a decision
// is remembered and returned, an invalid request returned as an error, and
// any other failure counted (against the breaker too when countFailure is
// set) and reported as local: decide it locally. The failure is returned
// with it, so the caller can tell a call the store still has (pending).
func (l *Limiter) settle(k key, req contract.Request, id store.Identity, d contract.Decision, err error, sent time.Time, countFailure bool) (_ contract.Decision, local bool, _ error) {
	switch {
	case err == nil:
		l.br.success()
		l.stats.storeDecisions.Add(1)
		l.remember(k, req, id, d, sent, l.clock.now())
		return d, false, nil
	case errors.Is(err, ratelimit.ErrInvalidRequest) || errors.Is(err, ratelimit.ErrInvalidPolicy):
		return contract.Decision{}, false, err
	}
	l.stats.failures.Add(1)
	l.stats.failedDecisions.Add(1)
	if countFailure && !errors.Is(err, ratelimit.ErrBadReply) { // one odd key is no outage
		l.br.failure(err.Error(), isTimeout(err))
	}
	return contract.Decision{}, true, err
}

// remember keeps the store's reply as the key's snapshot and updates the
// clock offset (the reply's time is taken as the middle of the round trip).
// A reply older than the snapshot held teaches the offset only: the callers
// of a shared pipeline wake in any order, and a late reply comes after
// newer ones.
func (l *Limiter) remember(k key, req contract.Request, id store.Identity, d contract.Decision, sent, recv time.Time) {
	l.learnOffset(d.State.Now, sent, recv)
	l.keep(k, req, id, d, true)
}

// keep keeps the store's reply d to req as the key's snapshot, unless the
// one held is newer; a refusal is cached only with cache (not from a late
// reply, which can come after a reset lifted the key).
func (l *Limiter) keep(k key, req contract.Request, id store.Identity, d contract.Decision, cache bool) {
	p := req.Policy
	sh := l.keys.shard(k)
	sh.mu.Lock()
	e := sh.entry(k)
	if e.snapValid && d.State.Now < e.snap.Now && e.policy != nil && *e.policy == p {
		sh.mu.Unlock()
		return
	}
	e.snap, e.snapValid = d.State, true
	if cache {
		e.refusedUntil = 0
	}
	if cache && !d.Allowed && d.RetryAfter > 0 && exactRetry(p.Algorithm) {
		e.refusedUntil = d.State.Now + d.RetryAfter.Microseconds()
		e.refusedCost, e.refusedW = req.Units(), req.Weight
		e.resendID, e.resendUntil = d.ResendID, d.ResendUntil
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
// store call would carry), the retry time not yet reached, and req not a
// resend of the admission the refusal's hint names (entry.resendID; guarded
// by TestResendIsNotRefusedFromTheCache).
func (l *Limiter) cachedRefusal(k key, req contract.Request, w contract.Weight) (contract.Decision, bool) {
	now := l.storeNow()
	sh := l.keys.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.lru.Peek(k)
	if !ok || e.refusedUntil == 0 || e.policy == nil || *e.policy != req.Policy || req.Units() < e.refusedCost ||
		!atLeastAsStrict(w, e.refusedW) {
		return contract.Decision{}, false
	}
	margin := refusalMargin.Microseconds() + l.offsetErr()
	if e.resendID != "" && (req.ID == e.resendID || reqid.IsShort(req.ID, e.resendID)) && now < e.resendUntil+margin {
		return contract.Decision{}, false // a resend of an admitted request: the store admits it
	}
	left := e.refusedUntil - now - margin
	if left <= 0 {
		return contract.Decision{}, false
	}
	l.stats.cachedRefusals.Add(1)
	reset := max(time.Duration(left)*time.Microsecond, time.Duration(e.snap.Now-now)*time.Microsecond)
	return contract.Decision{Decision: ratelimit.Decision{Limit: req.Policy.Capacity(), RetryAfter: time.Duration(left+margin) * time.Microsecond,
		ResetAfter: reset, Mode: ratelimit.ModeRedis}, State: e.snap}, true
}

// atLeastAsStrict reports whether weight w holds back at least as much as
// was (a zero Weight is 1/1).
func atLeastAsStrict(w, was contract.Weight) bool {
	num, den := max(w.Num, 1), max(w.Den, 1)
	wnum, wden := max(was.Num, 1), max(was.Den, 1)
	return num*wden >= wnum*den
}

// learnOffset offers the store's clock, read at storeNow between sent and
// recv, as the offset (offsetHolder.offer): the reply's time is taken as
// the middle of the round trip. Both decisions and heartbeats teach it, so
// the offset is known from the first heartbeat and follows a store clock
// that steps.
func (l *Limiter) learnOffset(storeNow int64, sent, recv time.Time) {
	if storeNow <= 0 {
		return
	}
	half := recv.Sub(sent).Microseconds() / 2
	l.offset.offer(storeOffset{us: storeNow - sent.UnixMicro() - half, errUS: half + 1, at: recv.UnixMicro()})
}

func (l *Limiter) keyOfIdentity(p ratelimit.Policy, id store.Identity) key {
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
	return beat + l.offset.load().us + (l.cfg.HeartbeatTTL + 2*l.cfg.HeartbeatInterval).Microseconds()
}

// storeNow estimates the store's clock in µs.
func (l *Limiter) storeNow() int64 { return l.clock.now().UnixMicro() + l.offset.load().us }

// offsetErr is how far storeNow may be off now (µs).
func (l *Limiter) offsetErr() int64 { return l.offset.load().errAt(l.clock.now().UnixMicro()) }

// weight holds back, in store decisions of algorithm alg, the shares of the
// suspect instances and, for the token bucket and GCRA, of the live ones
// still recovering (deciding locally). A recovering instance that has
// replayed grants from what is left of its share, which the store shows as
// free too. The window algorithms' hold-back lowers the whole limit: held
// back for the recovering instances, the first to close after a full outage
// refused polite keys until the others closed (TestFleetFaults/redis-kill),
// so there the rest of a recovering share can be granted twice for the
// moments of its recovery (docs/GUARANTEES.md).
func (l *Limiter) weight(alg ratelimit.Algorithm) contract.Weight {
	bucket, window := l.weights()
	return weightFor(alg, bucket, window)
}

// weights returns the weight of the token bucket's and GCRA's decisions
// and that of the window algorithms' (see weight).
func (l *Limiter) weights() (bucket, window contract.Weight) {
	live, suspect, recovering := l.live.Load(), l.heldBack.Load(), l.recovering.Load()
	if live <= 0 {
		return contract.Weight{}, contract.Weight{}
	}
	of := func(deciders int64) contract.Weight {
		if deciders >= live+suspect {
			return contract.Weight{}
		}
		return contract.Weight{Num: min(live+suspect, 1024), Den: min(max(1, deciders), 1024)}
	}
	return of(live - recovering), of(live)
}

func weightFor(alg ratelimit.Algorithm, bucket, window contract.Weight) contract.Weight {
	if alg == ratelimit.TokenBucket || alg == ratelimit.GCRA {
		return bucket
	}
	return window
}

// plainStore decides in a store without an extension that decides with
// weights (a store from outside this module): each request without its
// weight, and the decision without a state.
type plainStore struct{ s store.Store }

func (p plainStore) DecideWire(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	plain := make([]ratelimit.Request, len(reqs))
	for i, r := range reqs {
		plain[i] = r.Request
	}
	ds, errs := ratelimit.DecideAll(ctx, p.s, plain)
	out := make([]contract.Decision, len(ds))
	for i, d := range ds {
		out[i].Decision = d
	}
	return out, errs
}
