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

// Switch returns a limiter of p that continues from l (a limiter New
// returned), as the service carries a key's state across a policy change:
//
//   - token bucket: the key keeps its tokens, clamped to the new capacity,
//     and refills at the new rate from now on;
//   - GCRA: the key keeps its theoretical arrival time, the time until it
//     is full again, so its used units scale with the rate;
//   - sliding window log and counter: the entries and counts are kept and
//     judged against the new limit.
//
// A change of algorithm or window starts fresh (New(p)); so does a
// limiter that has seen no request yet. now (Unix µs) is when the change
// takes effect, not before l's last request.
func Switch(l Limiter, now int64, p Policy) (Limiter, error) {
	fresh, err := New(p)
	if err != nil {
		return nil, err
	}
	switch old := l.(type) {
	case *tokenBucket:
		nb, ok := fresh.(*tokenBucket)
		if !ok || nb.w != old.w || !old.seen {
			return fresh, nil
		}
		old.refill(now)
		nb.tokens, nb.last, nb.seen = min(old.tokens, nb.capScaled), max(old.last, now), true
		return nb, nil
	case *gcra:
		ng, ok := fresh.(*gcra)
		if !ok || ng.w != old.w {
			return fresh, nil
		}
		// The units ahead of now, in µs × old rate, become the same time
		// ahead in µs × new rate (rounded up: the key is not full sooner).
		if ahead := old.tat - now*old.rate; ahead > 0 {
			ng.tat = now*ng.rate + (ahead*ng.rate+old.rate-1)/old.rate
		}
		return ng, nil
	case *windowLog:
		nl, ok := fresh.(*windowLog)
		if !ok || nl.w != old.w {
			return fresh, nil
		}
		nl.times = append(nl.times, old.times...)
		return nl, nil
	case *windowCounter:
		nc, ok := fresh.(*windowCounter)
		if !ok || nc.w != old.w {
			return fresh, nil
		}
		nc.start, nc.cur, nc.prev, nc.seen = old.start, old.cur, old.prev, old.seen
		return nc, nil
	}
	return fresh, nil
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
	b.refill(now)
	if b.tokens >= b.w {
		b.tokens -= b.w
		return true
	}
	return false
}

// refill adds what the time since the last request brings, up to the
// capacity.
func (b *tokenBucket) refill(now int64) {
	if now <= b.last {
		return
	}
	elapsed := now - b.last
	if room := b.capScaled - b.tokens; elapsed >= (room+b.rate-1)/b.rate {
		b.tokens = b.capScaled
	} else {
		b.tokens += elapsed * b.rate
	}
	b.last = now
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
