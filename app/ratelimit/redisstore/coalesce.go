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
// left is not sent) and gets the answers it would get alone. n <= 0 turns
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
		c.flush(batch) // cl is in it: answered when this returns
		if next := c.next(); next != nil {
			go c.drain(next)
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

// flush sends the calls of batch still wanted in one pipeline, bounded by
// the earliest of their deadlines, and answers each.
func (c *coalescer) flush(batch []*call) {
	var reqs []ratelimit.Request
	var deadline time.Time
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
		if d, ok := cl.ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
			deadline = d
		}
		reqs = append(reqs, cl.reqs...)
		live = append(live, cl)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
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
