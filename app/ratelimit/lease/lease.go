// Package lease is lease mode, for hot keys: an instance takes a lease of
// L units of a key's quota in one store call, answers the key's requests
// from it until it is spent or expires, and gives back what it did not use.
//
// A policy opts in with ratelimit.Policy.Lease (GCRA only), the longest a
// lease is held. The bounds:
//
//   - Over-admission 0 by construction. A lease's units are counted in the
//     store when it is taken, held for the lease's lifetime: counted as
//     used at its end, so that no use of them within it lets the fleet
//     exceed what GCRA admits over any interval.
//   - Under-admission at most the units on lease, plus the refill of a
//     lifetime while the key's bucket is nearly full (the hold).
//   - The lease size follows the key's demand at this instance: the units
//     asked in the last lifetime, at most an eighth of the capacity and a
//     quarter of what the store last said was left. A key asked fewer than
//     four units (minUnits) in a lifetime is cold: it gets no lease and is
//     decided in the store as without lease mode.
//
// Wrap the limiter the service decides with (resilient.Limiter): a lease
// is taken only from a decision the store made (ratelimit.ModeRedis)
// while the limiter decides in the store (its breaker closed), so the
// breaker, the fallback budget, the journal and the replay see the draws
// as any other request and decide every request as without lease mode
// while the store is out. A lease already held is spent through an
// outage: its units were counted. Over a limiter that cannot hold units
// (any but resilient.Limiter and redisstore.Store), no lease is taken.
package lease

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/budget"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/reqid"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// minUnits is the demand, in units asked at this instance in a lease's
// lifetime, below which a key gets no lease.
const minUnits = 4

// Config tunes a Limiter. The zero value is usable.
type Config struct {
	// Instance prefixes the ids of the draws (unique across the fleet
	// anyway).
	Instance string
	// MaxKeys bounds the keys followed at once (default 10 000). A key
	// that finds the table full is decided without a lease.
	MaxKeys int
	// RefundTimeout bounds each refund call (default 1 s). A refund cut
	// off is not sent again: it may have been applied.
	RefundTimeout time.Duration
	// Tick is how often expired leases are given back and idle keys
	// dropped (default 50 ms).
	Tick time.Duration
	// Timeout bounds how long a request of a lease policy waits for the
	// store in all: for another request's draw, for its own draw, and for
	// its decision alone after a refused draw (RL_REDIS_TIMEOUT). The
	// wrapped resilient limiter gives each store call what is left, and
	// decides locally when nothing is. 0: no bound but the wrapped
	// limiter's own, per call.
	Timeout time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
}

// Limiter is a ratelimit.BatchLimiter that answers hot keys of lease
// policies from leases and passes every other request to the limiter it
// wraps. Create it with New; Close gives the leases back.
type Limiter struct {
	next     ratelimit.Limiter
	wire     contract.Decider // next's decisions with holds (nil: no leases)
	refunder contract.Refunder
	inStore  func() bool
	cfg      Config
	ids      *reqid.Minter

	mu   sync.Mutex
	keys map[leaseKey]*entry
	// held are the entries that hold a lease, which each tick looks at;
	// the whole table is swept for idle keys every idleSweep ticks only.
	held map[*entry]struct{}

	refunds chan refund
	stop    chan struct{}
	done    chan struct{}
	closed  atomic.Bool

	stats struct {
		served, draws, refused, refunded, lost atomic.Uint64
	}
}

// entry is one key of a lease policy at this instance.
type entry struct {
	policy ratelimit.Policy
	id     store.Identity // the client key's, as the store and its resets know it
	// gen is bumped by a reload of the policy and by a reset of the key,
	// cut by a reset only: a draw sent before either does not install its
	// units (a draw of the old policy would serve the new one; one from
	// before a reset, usage the reset lifted).
	gen, cut uint64
	// noDraw: the last draw was not decided in the store (it failed, timed
	// out or was granted locally): the key's requests go at their own cost,
	// for a lifetime and until one of them is decided in the store, instead
	// of each becoming a local draw of a whole lease.
	noDraw      bool
	noDrawUntil time.Time
	// Demand: units asked in the current period (one lifetime long) and
	// in the one before.
	period     time.Time
	seen, last int64
	lastSeen   time.Time
	// remaining is what the store said was left at its last decision of
	// the key (-1: none seen yet).
	remaining int64
	// drawing: a draw is out; done is closed when it is back (requests
	// that find no lease wait for it rather than each ask the store).
	drawing bool
	done    chan struct{}
	// The lease: units left, the store's decision of the draw and the
	// request it decided, and when the lease ends (local clock, from when
	// the draw was sent: no later than the store's time of the draw plus
	// the hold).
	units int64
	until time.Time
	draw  contract.Decision
	req   contract.Request
}

// New wraps next. With a resilient.Limiter (or a redisstore.Store) as next,
// unused units are given back to the store; with a resilient.Limiter,
// leases are taken only while it decides in the store, and a key's lease is
// forgotten when an operator resets the key.
func New(next ratelimit.Limiter, cfg Config) *Limiter {
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 10_000
	}
	if cfg.RefundTimeout <= 0 {
		cfg.RefundTimeout = time.Second
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 50 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l := &Limiter{
		next: next, cfg: cfg, ids: reqid.New(cfg.Instance + "-lease-"),
		keys: map[leaseKey]*entry{}, held: map[*entry]struct{}{},
		refunds: make(chan refund, 4096),
		stop:    make(chan struct{}), done: make(chan struct{}),
		inStore: func() bool { return true },
	}
	x := contract.Extension(next)
	if d, ok := x.(contract.Decider); ok {
		l.wire = d
	}
	if r, ok := x.(contract.Refunder); ok {
		l.refunder = r
	}
	if s, ok := x.(contract.Leasable); ok {
		l.inStore = s.InStore
		s.OnForget(l.forget)
	}
	go l.loop()
	return l
}

// Decide decides req: from a lease of its key, or by the wrapped limiter.
func (l *Limiter) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	if req.Policy.Lease <= 0 {
		return l.next.Decide(ctx, req)
	}
	ds, errs := l.DecideBatch(ctx, []ratelimit.Request{req})
	return ds[0], errs[0]
}

// pending is a request of a batch sent to the wrapped limiter.
type pending struct {
	at       int    // its index in the batch
	e        *entry // the key's entry when the request is a draw
	units    int64  // the request's own units
	gen, cut uint64 // the entry's when the draw was sent
	done     chan struct{}
}

// DecideBatch decides reqs, each as Decide would: those a lease answers
// here, the rest in one batch of the wrapped limiter (a draw in place of
// its request).
func (l *Limiter) DecideBatch(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, []error) {
	if l.wire == nil || !slices.ContainsFunc(reqs, func(r ratelimit.Request) bool { return r.Policy.Lease > 0 }) {
		return ratelimit.DecideAll(ctx, l.next, reqs)
	}
	ds, errs := make([]ratelimit.Decision, len(reqs)), make([]error, len(reqs))
	var (
		sent []contract.Request
		pend []pending
	)
	now := l.cfg.Now()
	if l.cfg.Timeout > 0 {
		ctx = budget.WithDeadline(ctx, time.Now().Add(l.cfg.Timeout))
	}
	for i, r := range reqs {
		if r.Policy.Lease > 0 && !r.ReadOnly && !l.closed.Load() && r.Validate() == nil {
			d, answered, draw, size := l.try(ctx, r, pend)
			if answered {
				ds[i] = d
				continue
			}
			if draw.e != nil {
				dr := contract.Request{Request: r, Hold: r.Policy.Lease}
				dr.Cost, dr.ID = size, l.ids.Next()
				sent = append(sent, dr)
				draw.at, draw.units = i, r.Units()
				pend = append(pend, draw)
				continue
			}
		}
		sent = append(sent, contract.Request{Request: r})
		pend = append(pend, pending{at: i})
	}
	if len(sent) == 0 {
		return ds, errs
	}
	gotDs, gotErrs := l.wire.DecideWire(ctx, sent)
	for j, p := range pend {
		d, err := gotDs[j], gotErrs[j]
		if p.e == nil {
			if err == nil && reqs[p.at].Policy.Lease > 0 && d.Mode == ratelimit.ModeRedis {
				l.mu.Lock()
				if e := l.keys[keyOf(reqs[p.at])]; e != nil && !e.drawing {
					e.remaining, e.noDraw = d.Remaining, false
				}
				l.mu.Unlock()
			}
			ds[p.at], errs[p.at] = d.Decision, err
			continue
		}
		leased := err == nil && d.Allowed && d.Mode == ratelimit.ModeRedis
		out := d.Decision
		l.mu.Lock()
		e := p.e
		close(p.done) // its waiters, whatever became of the entry
		if e.done == p.done {
			e.drawing = false
		}
		current := e.gen == p.gen
		switch {
		case !current:
		case err == nil && d.Mode == ratelimit.ModeRedis:
			e.remaining = d.Remaining
		default:
			e.noDraw, e.noDrawUntil = true, now.Add(e.policy.Lease)
		}
		stale := leased && !current
		if stale {
			// Reloaded or reset while the draw was out: its units are not
			// the entry's to serve. After a reload they go back; after a
			// reset they were usage the reset lifted (or are counted in
			// the fresh key: kept, the safe side).
			leased = false
			if e.cut == p.cut {
				r := sent[j]
				r.Cost, r.Hold = sent[j].Cost-p.units, 0
				l.queueRefund(r, d)
			}
		}
		if leased {
			// now was read before the draw was sent: the lease ends no
			// later than the store's time of the draw plus the hold.
			e.units, e.until = sent[j].Cost-p.units, now.Add(sent[j].Policy.Lease)
			e.draw, e.req = d, sent[j]
			l.held[e] = struct{}{}
			out = e.answer(l.cfg.Now())
			if l.closed.Load() {
				l.end(e)
			}
		}
		l.mu.Unlock()
		switch {
		case leased:
			l.stats.draws.Add(1)
		case stale:
			// The request itself was admitted by the draw.
		case err == nil && !d.Allowed:
			// The store had not the lease's units: decide the request
			// alone.
			l.stats.refused.Add(1)
			out, err = l.next.Decide(ctx, reqs[p.at])
		}
		// Else admitted without the store (the breaker opened meanwhile;
		// the rest of the units stay with the local budget that granted
		// them), or failed.
		ds[p.at], errs[p.at] = out, err
	}
	return ds, errs
}

// leaseKey names a request's key in the table: the policy's name and the
// client's key. (A policy reloaded with other parameters meets the entry
// of the old one: entry ends its lease and starts over.)
type leaseKey struct{ policy, key string }

func keyOf(r ratelimit.Request) leaseKey { return leaseKey{r.Policy.Name, r.Key} }

// try answers r from its key's lease when it can, waiting once for a draw
// that is out (unless the batch carries it: pend); else it returns the
// draw to send in r's place (its entry, generations and done channel) and
// its size, or no entry: r goes to the wrapped limiter as it came.
func (l *Limiter) try(ctx context.Context, r ratelimit.Request, pend []pending) (_ ratelimit.Decision, answered bool, draw pending, size int64) {
	units := r.Units()
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entry(r, now)
	if e == nil {
		return ratelimit.Decision{}, false, pending{}, 0
	}
	e.observe(now, units)
	waited := false
	for ; ; waited = true {
		if e.units >= units && now.Before(e.until) {
			e.units -= units
			l.stats.served.Add(1)
			return e.answer(now), true, pending{}, 0
		}
		if !e.drawing || waited || slices.ContainsFunc(pend, func(p pending) bool { return p.e == e }) {
			break
		}
		done := e.done
		l.mu.Unlock()
		var expired <-chan time.Time
		if dl, ok := budget.Deadline(ctx); ok {
			t := time.NewTimer(time.Until(dl))
			expired = t.C
			defer t.Stop()
		}
		select {
		case <-done:
		case <-expired:
		case <-ctx.Done():
		}
		now = l.cfg.Now()
		l.mu.Lock()
	}
	// A request that waited for a draw does not send one: what is left of
	// its time goes to a decision at its own cost.
	if size = e.size(units); size <= units || waited || e.drawing || e.noDraw || now.Before(e.noDrawUntil) || !l.inStore() {
		return ratelimit.Decision{}, false, pending{}, 0
	}
	l.end(e)
	e.drawing, e.done = true, make(chan struct{})
	return ratelimit.Decision{}, false, pending{e: e, gen: e.gen, cut: e.cut, done: e.done}, size
}

// entry returns r's entry, made if there is room; nil when the table is
// full. l.mu is held.
func (l *Limiter) entry(r ratelimit.Request, now time.Time) *entry {
	k := keyOf(r)
	e := l.keys[k]
	if e != nil {
		if e.policy != r.Policy { // reloaded with other parameters
			l.end(e)
			// A draw still out installs nothing (gen); the new policy's
			// requests do not wait for it.
			*e = entry{policy: r.Policy, id: e.id, gen: e.gen + 1, cut: e.cut, period: now, remaining: -1}
		}
		return e
	}
	if len(l.keys) >= l.cfg.MaxKeys {
		return nil
	}
	e = &entry{policy: r.Policy, id: store.IdentityOf(r.Key), period: now, remaining: -1}
	l.keys[k] = e
	return e
}

// observe counts units asked at now, in periods of one lifetime.
func (e *entry) observe(now time.Time, units int64) {
	life := e.policy.Lease
	if el := now.Sub(e.period); el >= life {
		e.last = e.seen
		if el >= 2*life {
			e.last = 0
		}
		e.seen, e.period = 0, now
	}
	e.seen += units
	e.lastSeen = now
}

// size is the lease to take for a request of units: the demand of a
// lifetime, at most an eighth of the capacity and a quarter of what the
// store last said was left; 0 for a cold key.
func (e *entry) size(units int64) int64 {
	demand := max(e.last, e.seen)
	if demand < minUnits || e.remaining < 0 {
		return 0
	}
	return max(0, min(demand, e.policy.Capacity()/8, e.remaining/4))
}

// answer is the decision of a request served from the lease: admitted, in
// the store's mode, with what the store had left at the draw plus the
// lease's units.
func (e *entry) answer(now time.Time) ratelimit.Decision {
	d := e.draw.Decision
	d.Allowed, d.RetryAfter = true, 0
	d.Remaining += e.units
	d.ResetAfter = max(0, d.ResetAfter-now.Sub(e.until.Add(-e.policy.Lease)))
	return d
}

// end ends e's lease, queueing the refund of its unused units. l.mu is
// held.
func (l *Limiter) end(e *entry) {
	delete(l.held, e)
	if e.units <= 0 {
		e.units = 0
		return
	}
	r := e.req
	r.Cost, r.Hold = e.units, 0
	e.units = 0
	l.queueRefund(r, e.draw)
}

// forget drops what this instance holds of the key of identity id under
// policy p: an operator reset it (contract.Leasable's OnForget). Its lease's
// units were counted before the reset, which lifted them: they are
// neither served nor given back (given back, they would free units of the
// fresh key's usage), and a draw out installs nothing.
func (l *Limiter) forget(p ratelimit.Policy, id store.Identity) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, e := range l.keys {
		if k.policy != p.Name || e.id != id {
			continue
		}
		l.stats.lost.Add(uint64(max(0, e.units)))
		e.units = 0
		delete(l.held, e)
		e.gen++
		e.cut++
		e.noDraw = false
		e.remaining = -1
	}
}
