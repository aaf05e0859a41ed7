package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

// OnLate makes the store report what becomes of every decision whose caller
// stopped waiting before its answer came (see contract.LateReply): fn is
// called once for each such request, from the goroutine that read the
// pipeline, as soon as its fate is known: the reply itself when it comes
// within window after the caller's deadline, else an error. It needs
// coalescing (Config.Coalescing), and a client whose read timeout allows the
// window (ClientConfig.LateReplies); without coalescing it does nothing and
// reports false. Call it before the first decision.
//
// A decision that times out on the client has often run in Redis all the
// same (a slow Redis applies every call and answers late): with OnLate the
// caller learns that it did, and what Redis answered, instead of guessing.
// The store's own calls (heartbeats, pings) read their late replies within
// the window too, and drop them: their connections stay open.
func (l *Store) onLate(window time.Duration, fn func(contract.LateReply)) bool {
	if l.co == nil || fn == nil {
		return false
	}
	l.co.late, l.co.window = fn, max(window, 0)
	return true
}

// coalescer queues calls and sends them in at most max pipelines at once.
type coalescer struct {
	max     int
	timeout time.Duration // the store's own per-call bound (0: none)
	send    func(context.Context, []contract.Request) ([]contract.Decision, []error)
	// late, if set, is told the fate of calls their callers gave up on
	// (OnLate); the pipelines then read replies for window past the last
	// caller's deadline.
	late   func(contract.LateReply)
	window time.Duration

	mu       sync.Mutex
	queue    []*call
	inflight int
	lastSent time.Time // when the latest pipeline left
}

// patience is how long after the latest pipeline left a call still waits
// for a slot instead of sending another pipeline (see Config.Coalescing).
func (c *coalescer) patience() time.Duration { return max(2*time.Millisecond, c.timeout/10) }

// slotLocked reports whether a call may send a pipeline now, taking the
// slot if so. c.mu must be held.
func (c *coalescer) slotLocked(now time.Time) bool {
	if c.inflight < c.max || c.inflight < 16*c.max && now.Sub(c.lastSent) > c.patience() {
		c.inflight++
		c.lastSent = now
		return true
	}
	return false
}

// The states of a call: its answer is handed either to its caller or, once
// the caller has gone, to the late handler; never both, never neither.
const (
	waiting   int32 = iota
	answered        // the caller takes ds and errs
	abandoned       // the caller left; the answer goes to late
)

// call is one caller's requests, answered together.
type call struct {
	ctx   context.Context
	reqs  []contract.Request
	ds    []contract.Decision
	errs  []error
	state atomic.Int32
	done  chan struct{} // closed once ds and errs are set for the caller
}

// errNotSent: the call's caller left before its pipeline went out.
var errNotSent = errors.New("redisstore: the caller left before the call was sent")

func (c *coalescer) do(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	cl := &call{ctx: ctx, reqs: reqs, done: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, cl)
	if c.slotLocked(time.Now()) {
		batch := c.queue
		c.queue = nil
		c.mu.Unlock()
		if len(batch) == 1 && c.late == nil {
			// Alone, and nobody to hand a late answer to: the
			// pipeline's deadline is this call's own, so it can be sent
			// from here without a goroutine.
			c.flush(batch)
			if next := c.next(); next != nil {
				go c.drain(next)
			}
		} else {
			// Shared, or read past this call's deadline: the pipeline
			// may outlive the call, and the call must not wait for it.
			go c.drain(batch)
		}
	} else {
		c.mu.Unlock()
	}
	select {
	case <-cl.done:
		return cl.ds, cl.errs
	case <-ctx.Done():
		if !cl.state.CompareAndSwap(waiting, abandoned) {
			// The answer came as the context ended: it is this
			// caller's, and Redis counted it.
			<-cl.done
			return cl.ds, cl.errs
		}
		errs := make([]error, len(reqs))
		for i := range errs {
			if c.late != nil {
				errs[i] = fmt.Errorf("redisstore: %w: %w", ctx.Err(), contract.ErrPending)
			} else {
				errs[i] = fmt.Errorf("redisstore: %w", ctx.Err())
			}
		}
		return make([]contract.Decision, len(reqs)), errs
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
	c.lastSent = time.Now()
	return batch
}

// drain sends batches until the queue is empty.
func (c *coalescer) drain(batch []*call) {
	for batch != nil {
		c.flush(batch)
		batch = c.next()
	}
}

// answer hands ds and errs to cl's caller or, if it has left, to the late
// handler (sent says whether the call reached the pipeline).
func (c *coalescer) answer(cl *call, ds []contract.Decision, errs []error, sent bool) {
	cl.ds, cl.errs = ds, errs
	if cl.state.CompareAndSwap(waiting, answered) {
		close(cl.done)
		return
	}
	if c.late == nil {
		return
	}
	for i, r := range cl.reqs {
		lr := contract.LateReply{Request: r, Err: errs[i], NotSent: !sent}
		if lr.Err == nil {
			lr.Decision = ds[i]
		}
		c.late(lr)
	}
}

// flush sends the calls of batch still wanted in one pipeline and answers
// each. The pipeline is bounded by the latest of their deadlines (and the
// store's own timeout), plus the late window: each caller stops waiting at
// its own deadline, so no call is cut short by another's, and none waits
// longer than it would alone.
func (c *coalescer) flush(batch []*call) {
	var reqs []contract.Request
	var deadline time.Time
	unbounded := false // a call without a deadline
	live := batch[:0:0]
	for _, cl := range batch {
		if err := cl.ctx.Err(); err != nil {
			errs := make([]error, len(cl.reqs))
			for i := range errs {
				errs[i] = fmt.Errorf("redisstore: %w: %w", err, errNotSent)
			}
			c.answer(cl, make([]contract.Decision, len(cl.reqs)), errs, false)
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
	// The first caller's values (its trace span: the pipeline's Redis calls
	// show under its decision), none of its cancellation.
	ctx, cancel := context.WithoutCancel(live[0].ctx), context.CancelFunc(func() {})
	if unbounded {
		deadline = time.Time{}
	}
	if c.timeout > 0 {
		if d := time.Now().Add(c.timeout); deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	}
	if !deadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(c.window))
	}
	ds, errs := c.send(ctx, reqs)
	cancel()
	for _, cl := range live {
		n := len(cl.reqs)
		c.answer(cl, ds[:n:n], errs[:n:n], true)
		ds, errs = ds[n:], errs[n:]
	}
}
