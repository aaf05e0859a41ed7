// The background: a loop ends expired leases, drops idle keys and sends
// the refunds (a lease's unused units go back to the store when it ends);
// Close gives back the units of the leases still held.

package lease

import (
	"context"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

type refund struct {
	req contract.Request
	d   contract.Decision
}

// queueRefund queues the refund of r's units, admitted by the store's
// decision d.
func (l *Limiter) queueRefund(r contract.Request, d contract.Decision) {
	if r.Cost <= 0 {
		return
	}
	if l.refunder == nil {
		l.stats.lost.Add(uint64(r.Cost))
		return
	}
	select {
	case l.refunds <- refund{req: r, d: d}:
	default:
		l.stats.lost.Add(uint64(r.Cost))
	}
}

// loop ends expired leases and drops idle keys every Tick, and sends the
// refunds, until Close.
func (l *Limiter) loop() {
	defer close(l.done)
	t := time.NewTicker(l.cfg.Tick)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.sendRefunds(ctx)
	}()
	for n := 1; ; n++ {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.sweep(l.cfg.Now(), n%idleSweep == 0)
		}
	}
}

// idleSweep is how many ticks apart the whole table is swept for idle
// keys: a sweep holds the table's lock for a walk of every key.
const idleSweep = 20

// sweep ends the leases spent or expired at now and, with idle, drops the
// keys idle for two lifetimes with nothing held.
func (l *Limiter) sweep(now time.Time, idle bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for e := range l.held {
		if e.units <= 0 || !now.Before(e.until) {
			l.end(e)
		}
	}
	if !idle {
		return
	}
	for k, e := range l.keys {
		if e.units == 0 && !e.drawing && now.Sub(e.lastSeen) >= 2*e.policy.Lease {
			delete(l.keys, k)
		}
	}
}

// sendRefunds sends the queued refunds until ctx ends.
func (l *Limiter) sendRefunds(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-l.refunds:
			l.send(ctx, r)
		}
	}
}

func (l *Limiter) send(ctx context.Context, r refund) {
	callCtx, cancel := context.WithTimeout(ctx, l.cfg.RefundTimeout)
	n, err := l.refunder.Refund(callCtx, r.req, r.d)
	cancel()
	if err != nil {
		n = 0
	}
	l.stats.refunded.Add(uint64(n))
	l.stats.lost.Add(uint64(r.req.Cost - n))
}

// Close stops taking leases and gives back the unused units of those held,
// within ctx. It does not close the wrapped limiter.
func (l *Limiter) Close(ctx context.Context) error {
	if l.closed.Swap(true) {
		return nil
	}
	close(l.stop)
	<-l.done
	l.mu.Lock()
	for e := range l.held {
		l.end(e)
	}
	l.mu.Unlock()
	for {
		select {
		case r := <-l.refunds:
			if err := ctx.Err(); err != nil {
				l.stats.lost.Add(uint64(r.req.Cost))
				continue
			}
			l.send(ctx, r)
		default:
			return ctx.Err()
		}
	}
}
