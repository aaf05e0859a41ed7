// Late replies: a decision whose store call timed out is decided locally,
// but the store often decided it too (a slow Redis runs every call and
// answers late). The store reports each such call's fate
// (contract.LateReply), and the local grant waits for it as a doubt in the
// journal: dropped when the store counted the request, replayed when it did
// not. Without this, every timed-out call that ran was counted twice: in
// the store, and again by the replay of its local grant, and a key of a
// slow Redis was locked out after the fault (TestFleetFaults/redis-slow).

package resilient

import (
	"context"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// maxLate bounds the requests the late book follows (refused doubts and
// replies that came before their doubt): far more than the calls a store
// can hold at once. Past it a reply is not followed, and its doubt is
// settled by expiry (counted).
const maxLate = 1 << 16

// lateBook follows the requests decided locally while the store still had
// their calls, beside the journal's doubts (the ones granted):
//   - refused: refused locally; if the store admitted it after all, it
//     counted a request that was refused (see LateStats.Overcounted);
//   - early: a late reply that came before its request was decided
//     locally (the store answered just after the caller's deadline).
//
// Its lock is taken before the journal's.
type lateBook struct {
	mu      sync.Mutex
	refused map[string]int64 // request id: store µs of the local refusal
	early   map[string]earlyReply
	// waiting are the requests whose local refusal waits for their late
	// reply (awaitLate).
	waiting map[string]chan contract.LateReply
	stats   LateStats
	refunds refunds
}

// earlyReply is a late reply that came before its local decision, and when
// (store µs).
type earlyReply struct {
	r  contract.LateReply
	at int64
}

// LateStats counts what became of the requests decided locally while the
// store still had their calls.
type LateStats struct {
	// Present: granted locally, and the store had counted them: dropped
	// from the journal (counted once).
	Present uint64 `json:"present"`
	// Counted: granted locally, and the store had not counted them (it
	// refused, or never got the call): replayed.
	Counted uint64 `json:"counted"`
	// Unknown: granted locally, and the store's reply was lost or did not
	// come in time: replayed, so counted twice if the store had counted
	// them.
	Unknown uint64 `json:"unknown"`
	// Overcounted: refused locally, and admitted (so counted) by the
	// store: usage the client did not get. Refunded of them were given
	// back to the store (a store that can: redisstore's Refund); the rest
	// stay counted (the refund failed, or the queue was full).
	Overcounted uint64 `json:"overcounted"`
	Refunded    uint64 `json:"refunded"`
	// Expired: doubts whose reply never came (the store was replaced, say):
	// replayed.
	Expired uint64 `json:"expired"`
	// Awaited: requests answered by the store's late reply, which came
	// within LateGrace, instead of by the local share.
	Awaited uint64 `json:"awaited"`
}

// journalGrant journals a local grant: a doubt when the store still has the
// request's call (pending), settled at once if its late reply came first.
func (l *Limiter) journalGrant(p ratelimit.Policy, id store.Identity, g store.Grant, pending bool) error {
	if !pending {
		return l.journal.Append(p, id, g)
	}
	b := &l.late
	b.mu.Lock()
	err := l.journal.AppendDoubt(p, id, g)
	e, early := b.early[g.ID]
	if early {
		delete(b.early, g.ID)
	}
	b.mu.Unlock()
	if err == nil && early {
		l.onLate(e.r)
	}
	return err
}

// refuse notes a local refusal of req, whose call the store still has.
func (b *lateBook) refuse(req contract.Request, now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.early[req.ID]; ok {
		delete(b.early, req.ID)
		if e.r.Err == nil && e.r.Decision.Allowed {
			b.stats.Overcounted += uint64(req.Units())
			b.refunds.add(e.r)
		}
		return
	}
	if b.refused == nil {
		b.refused = map[string]int64{}
	}
	if len(b.refused) < maxLate {
		b.refused[req.ID] = now
	}
}

// onLate settles a request by its late reply: it is the store's LateReporter
// callback, called once per request whose caller stopped waiting.
func (l *Limiter) onLate(r contract.LateReply) {
	counted := r.Err == nil && r.Decision.Allowed
	if r.Err == nil {
		// The reply is the store's state after the request: a snapshot
		// like any other (keep keeps the newest). Not a clock reading:
		// how long it took is not known.
		id := store.IdentityOf(r.Request.Key)
		l.keep(l.keyOfIdentity(r.Request.Policy, id), r.Request, id, r.Decision, false)
	}
	b := &l.late
	b.mu.Lock()
	if ch, waiting := b.waiting[r.Request.ID]; waiting {
		delete(b.waiting, r.Request.ID)
		ch <- r // buffered: awaitLate takes it, now or as it gives up
		b.mu.Unlock()
		return
	}
	p, id, units, ok := l.journal.Resolve(r.Request.ID, counted)
	switch {
	case ok && counted:
		b.stats.Present += uint64(units)
	case ok && r.Err != nil && !r.NotSent:
		b.stats.Unknown += uint64(units)
	case ok:
		b.stats.Counted += uint64(units)
	default:
		if _, refused := b.refused[r.Request.ID]; refused {
			delete(b.refused, r.Request.ID)
			if counted {
				b.stats.Overcounted += uint64(r.Request.Units())
				l.refund(r)
			}
		} else if len(b.early) < maxLate {
			// Its local decision is still being made.
			if b.early == nil {
				b.early = map[string]earlyReply{}
			}
			b.early[r.Request.ID] = earlyReply{r: r, at: l.storeNow()}
		}
	}
	b.mu.Unlock()
	if ok && counted {
		l.synced(p, id, units, r.Decision.State.Now)
	}
}

// expireLate settles what the late book and the journal still wait for
// after the late window: a doubt whose reply never came is counted, and the
// book forgets requests older than that.
func (l *Limiter) expireLate() {
	now := l.storeNow()
	before := now - (l.cfg.LateWindow + 2*l.cfg.Timeout + l.cfg.ProbeInterval).Microseconds()
	n := l.journal.ExpireDoubts(before)
	b := &l.late
	b.mu.Lock()
	b.stats.Expired += uint64(n)
	for id, at := range b.refused {
		if at < before {
			delete(b.refused, id)
		}
	}
	// A reply waits for its local decision for microseconds: one still
	// here a second later belongs to a request that was never decided
	// locally.
	for id, e := range b.early {
		if e.at < now-time.Second.Microseconds() {
			delete(b.early, id)
		}
	}
	b.mu.Unlock()
}

// lateStats returns the late book's counters.
func (l *Limiter) lateStats() LateStats {
	l.late.mu.Lock()
	defer l.late.mu.Unlock()
	return l.late.stats
}

// maxRefunds bounds the refunds waiting to be sent; past it an overcount
// stays.
const maxRefunds = 4096

// refunds queues the admissions to give back: the store admitted them after
// their callers' deadlines, and the callers were refused locally. One
// goroutine sends them, each once (a refund that timed out may have been
// applied: a second one would give back usage that is real).
type refunds struct {
	queue chan contract.LateReply // nil: the store cannot refund
}

// add queues r's refund, unless the queue is full or there is none. The
// late book's lock is held.
func (q *refunds) add(r contract.LateReply) {
	if q.queue == nil {
		return
	}
	select {
	case q.queue <- r:
	default:
	}
}

// refund queues r's refund (see refunds). The late book's lock is held.
func (l *Limiter) refund(r contract.LateReply) { l.late.refunds.add(r) }

// refundSenders is how many refunds are out at once. A refund is sent
// when the store is slow (its reply came after the caller's deadline), and
// one at a time, each a slow round trip, they fall behind the tens a second
// an instance under load queues behind such a store.
const refundSenders = 4

// sendRefunds sends the queued refunds until ctx ends. Each may take
// the late window past Timeout: nobody waits on it, and one cut off at
// Timeout behind a slow store is lost (it may have been applied, so it is
// not sent again) and the client stays charged (TestSlowStoreRefunds).
func (l *Limiter) sendRefunds(ctx context.Context, s contract.Refunder) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-l.late.refunds.queue:
			callCtx, cancel := context.WithTimeout(ctx, l.cfg.Timeout+l.cfg.LateWindow)
			n, err := s.Refund(callCtx, r.Request, r.Decision)
			cancel()
			if err == nil && n > 0 {
				l.late.mu.Lock()
				l.late.stats.Refunded += uint64(n)
				l.late.mu.Unlock()
			}
		}
	}
}

// awaitLate waits until until (local time) for the late reply to req, and
// returns the store's decision if it came with one. The store counted what it admitted, as for any of its
// decisions.
func (l *Limiter) awaitLate(req contract.Request, until time.Time) (contract.Decision, bool) {
	b := &l.late
	b.mu.Lock()
	if e, ok := b.early[req.ID]; ok {
		delete(b.early, req.ID)
		b.mu.Unlock()
		return l.lateDecision(e.r)
	}
	wait := until.Sub(l.clock.now())
	if wait <= 0 || len(b.waiting) >= maxLate {
		b.mu.Unlock()
		return contract.Decision{}, false
	}
	if b.waiting == nil {
		b.waiting = map[string]chan contract.LateReply{}
	}
	ch := make(chan contract.LateReply, 1)
	b.waiting[req.ID] = ch
	b.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case r := <-ch:
		return l.lateDecision(r)
	case <-t.C:
	}
	b.mu.Lock()
	delete(b.waiting, req.ID)
	b.mu.Unlock()
	select {
	case r := <-ch: // it came as the wait ended
		return l.lateDecision(r)
	default:
		return contract.Decision{}, false
	}
}

// lateDecision is the decision a late reply carries, if it carries one.
func (l *Limiter) lateDecision(r contract.LateReply) (contract.Decision, bool) {
	if r.Err != nil {
		return contract.Decision{}, false
	}
	// Answered in time to serve: the store is slow, not stalled (a reply
	// that came later says nothing of the kind: behind 300 ms of latency
	// the breaker must still open, and the shares refill).
	l.br.alive()
	l.late.mu.Lock()
	l.late.stats.Awaited++
	l.late.mu.Unlock()
	l.stats.storeDecisions.Add(1)
	return r.Decision, true
}

// refundStore gives back units of req that the store admitted by d (a lease's
// unused units, package lease) and returns how many it gave back. It does
// nothing for a decision the store did not make, nor while the breaker is
// not closed: the units stay counted. The units go back at the weight the
// store charged them at (d.Weight), not at the one this instance decides
// with now: given back at a stricter weight, they would be more than were
// taken (TestRefundAtTheDrawsWeight).
func (l *Limiter) refundStore(ctx context.Context, req contract.Request, d contract.Decision) (int64, error) {
	r, ok := l.ext.(contract.Refunder)
	if !ok || d.Mode != ratelimit.ModeRedis || !l.inStore() {
		return 0, nil
	}
	req.Weight = d.Weight
	return r.Refund(ctx, req, d)
}
