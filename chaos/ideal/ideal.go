// Package ideal holds single-process reference limiters, one per algorithm,
// with the exact semantics the chaos suite judges the fleet against: what
// one perfect limiter would have admitted had it seen every request at its
// send time. Times are Unix microseconds; every quantity is an integer, so
// decisions at boundaries are exact.
//
// These are written from the algorithms' definitions, independently of the
// service's implementation (the chaos suite is black-box).
package ideal

import "fmt"

// Algorithm names, as in report.json.
const (
	TokenBucket          = "token_bucket"
	GCRA                 = "gcra"
	SlidingWindowLog     = "sliding_window_log"
	SlidingWindowCounter = "sliding_window_counter"
)

// Policy parameterises a limiter. For the window algorithms Limit units are
// admitted per Window; for token bucket and GCRA Capacity is the burst
// (0 means Limit) and the rate is Limit per Window.
type Policy struct {
	Algorithm string
	Limit     int64
	WindowUS  int64
	Capacity  int64
}

// Limiter decides one key's requests, in non-decreasing time order.
// Implementations are not safe for concurrent use.
type Limiter interface {
	// Allow decides a request of one unit at now (Unix µs).
	Allow(now int64) bool
}

// New returns a fresh limiter (a key never seen) for p.
func New(p Policy) (Limiter, error) {
	if p.Limit <= 0 || p.WindowUS <= 0 {
		return nil, fmt.Errorf("ideal: policy %+v: limit and window must be positive", p)
	}
	c := p.Capacity
	if c <= 0 {
		c = p.Limit
	}
	switch p.Algorithm {
	case TokenBucket:
		return &tokenBucket{capScaled: c * p.WindowUS, rate: p.Limit, w: p.WindowUS}, nil
	case GCRA:
		return &gcra{tolerance: c * p.WindowUS, rate: p.Limit, w: p.WindowUS}, nil
	case SlidingWindowLog:
		return &windowLog{limit: p.Limit, w: p.WindowUS}, nil
	case SlidingWindowCounter:
		return &windowCounter{limit: p.Limit, w: p.WindowUS}, nil
	}
	return nil, fmt.Errorf("ideal: unknown algorithm %q", p.Algorithm)
}

// tokenBucket holds capacity C, refilled continuously at Limit per Window.
// Levels are tokens × window µs, so one µs adds exactly Limit.
type tokenBucket struct {
	capScaled, rate, w int64
	tokens, last       int64
	seen               bool
}

func (b *tokenBucket) Allow(now int64) bool {
	if !b.seen {
		b.tokens, b.last, b.seen = b.capScaled, now, true
	}
	if now > b.last {
		elapsed := now - b.last
		if room := b.capScaled - b.tokens; elapsed >= (room+b.rate-1)/b.rate {
			b.tokens = b.capScaled
		} else {
			b.tokens += elapsed * b.rate
		}
		b.last = now
	}
	if b.tokens >= b.w {
		b.tokens -= b.w
		return true
	}
	return false
}

// gcra keeps the theoretical arrival time, scaled by Limit (µs × Limit), so
// the emission interval Window/Limit is exactly Window in these units. A
// request is admitted when the new TAT is at most Capacity intervals ahead
// of now: the same admissions as the token bucket above.
type gcra struct {
	tolerance, rate, w int64
	tat                int64 // µs × rate
}

func (g *gcra) Allow(now int64) bool {
	t := max(g.tat, now*g.rate)
	next := t + g.w
	if next-now*g.rate <= g.tolerance {
		g.tat = next
		return true
	}
	return false
}

// windowLog admits a request when fewer than Limit admissions fall in
// (now - Window, now].
type windowLog struct {
	limit, w int64
	times    []int64
}

func (l *windowLog) Allow(now int64) bool {
	i := 0
	for i < len(l.times) && l.times[i] <= now-l.w {
		i++
	}
	l.times = l.times[i:]
	if int64(len(l.times)) < l.limit {
		l.times = append(l.times, now)
		return true
	}
	return false
}

// windowCounter counts admissions per Unix-epoch-aligned window and admits
// a request when prev × (Window - elapsed)/Window + cur + 1 <= Limit, prev
// being the previous aligned window's count and elapsed the time since the
// current window began.
type windowCounter struct {
	limit, w  int64
	start     int64 // the current window's start
	cur, prev int64
	seen      bool
}

func (c *windowCounter) Allow(now int64) bool {
	start := now - now%c.w
	switch {
	case c.seen && start == c.start:
	case c.seen && start == c.start+c.w:
		c.prev, c.cur = c.cur, 0
	default:
		c.prev, c.cur = 0, 0
	}
	c.start, c.seen = start, true
	elapsed := now - start
	if c.prev*(c.w-elapsed)+(c.cur+1)*c.w <= c.limit*c.w {
		c.cur++
		return true
	}
	return false
}
