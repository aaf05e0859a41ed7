package redisstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// WithCoalescing makes concurrent decisions share pipelines, so that many
// callers cost Redis a few round trips instead of one each. A call that
// finds fewer than n pipelines in flight sends at once, taking along
// whatever calls are queued: a lone caller waits for nothing. Otherwise it
// queues, and the next pipeline to finish sends the whole queue. Each call
// keeps its own deadline (a call whose context ended before its pipeline
// left is not sent; one that ends while its pipeline is out returns then,
// and the pipeline goes on for the others) and gets the answers it would
// get alone. n <= 0 turns
// coalescing off (the default: one round trip per call). On a Cluster,
// go-redis splits each pipeline per node.
func WithCoalescing(n int) Option {
	return func(l *Limiter) {
		if n > 0 {
			l.co = &coalescer{max: n, send: l.pipeline, timeout: l.timeout}
		}
	}
}

// coalescer queues calls and sends them in at most max pipelines at once.
type coalescer struct {
	max     int
	timeout time.Duration // the store's own per-call bound (0: none)
	send    func(context.Context, []ratelimit.Request) ([]ratelimit.Decision, []error)

	mu       sync.Mutex
	queue    []*call
	inflight int
}

// call is one caller's requests, answered together.
type call struct {
	ctx  context.Context
	reqs []ratelimit.Request
	ds   []ratelimit.Decision
	errs []error
	done chan struct{} // closed once ds and errs are set
}

func (c *coalescer) do(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, []error) {
	cl := &call{ctx: ctx, reqs: reqs, done: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, cl)
	if c.inflight < c.max {
		c.inflight++
		batch := c.queue
		c.queue = nil
		c.mu.Unlock()
		if len(batch) == 1 {
			// Alone: the pipeline's deadline is this call's own, so it
			// can be sent from here without a goroutine.
			c.flush(batch)
			if next := c.next(); next != nil {
				go c.drain(next)
			}
		} else {
			// Shared: the pipeline may outlive this call's deadline (it
			// takes the latest of its calls'), and this call must not.
			go c.drain(batch)
		}
	} else {
		c.mu.Unlock()
	}
	select {
	case <-cl.done:
		return cl.ds, cl.errs
	case <-ctx.Done():
		errs := make([]error, len(reqs))
		for i := range errs {
			errs[i] = fmt.Errorf("redisstore: %w", ctx.Err())
		}
		return make([]ratelimit.Decision, len(reqs)), errs
	}
}

// next takes the queue when there is one, keeping this pipeline slot, or
// gives the slot back.
func (c *coalescer) next() []*call {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.inflight--
		return nil
	}
	batch := c.queue
	c.queue = nil
	return batch
}

// drain sends batches until the queue is empty.
func (c *coalescer) drain(batch []*call) {
	for batch != nil {
		c.flush(batch)
		batch = c.next()
	}
}

// flush sends the calls of batch still wanted in one pipeline and answers
// each. The pipeline is bounded by the latest of their deadlines (and the
// store's own timeout): each caller stops waiting at its own deadline, so
// no call is cut short by another's, and none waits longer than it would
// alone.
func (c *coalescer) flush(batch []*call) {
	var reqs []ratelimit.Request
	var deadline time.Time
	unbounded := false // a call without a deadline
	live := batch[:0:0]
	for _, cl := range batch {
		if err := cl.ctx.Err(); err != nil {
			cl.errs = make([]error, len(cl.reqs))
			for i := range cl.errs {
				cl.errs[i] = fmt.Errorf("redisstore: %w", err)
			}
			cl.ds = make([]ratelimit.Decision, len(cl.reqs))
			close(cl.done)
			continue
		}
		d, ok := cl.ctx.Deadline()
		switch {
		case !ok:
			unbounded = true
		case d.After(deadline):
			deadline = d
		}
		reqs = append(reqs, cl.reqs...)
		live = append(live, cl)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if unbounded {
		deadline = time.Time{}
	}
	if c.timeout > 0 {
		if d := time.Now().Add(c.timeout); deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	}
	if !deadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, deadline)
	}
	ds, errs := c.send(ctx, reqs)
	cancel()
	for _, cl := range live {
		n := len(cl.reqs)
		cl.ds, cl.errs = ds[:n:n], errs[:n:n]
		ds, errs = ds[n:], errs[n:]
		close(cl.done)
	}
}
