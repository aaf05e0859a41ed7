// Package algorithm holds the four algorithms as pure state transitions:
// (policy, state, now, cost, weight) -> (state, decision), and their replay
// twins (policy, state, now, grants) -> (state, result). Every quantity is an
// integer (time in µs, token levels scaled by the window in µs) so that the
// Lua twins in redisstore, which compute in float64, agree to the bit. Each
// function expects a validated policy, 0 <= cost <= p.Capacity() (0: a
// read-only request, which changes nothing) and a
// valid weight (see contract.Weight: the decider's share of the policy is
// Den/Num of it). The in-memory store and the resilient limiter's fallback
// decide with them.
package algorithm

import (
	"sort"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

// TokenBucketState is a token bucket's stored state. The zero value is a
// key never seen (a full bucket).
type TokenBucketState struct {
	Tokens int64 // tokens × window µs
	Last   int64 // µs since the epoch of the last update; 0 = never
}

// TokenBucketDecide applies one request at time now (µs) to a token bucket.
func TokenBucketDecide(p ratelimit.Policy, s TokenBucketState, now, cost int64, wt contract.Weight) (TokenBucketState, contract.Decision) {
	w, capScaled, rate := p.Window.Microseconds(), p.Capacity()*p.Window.Microseconds(), p.Limit
	tokens := capScaled
	if s.Last != 0 {
		tokens = tokenBucketFill(s.Tokens, now-s.Last, capScaled, rate)
	}
	d := contract.Decision{Decision: ratelimit.Decision{Limit: p.Capacity()}}
	if need := scale(wt, cost*w); tokens >= need {
		d.Allowed = true
		tokens -= need
	} else {
		d.RetryAfter = micros(ceilDiv(need-tokens, rate))
	}
	d.Remaining = units(wt, tokens, w)
	d.ResetAfter = micros(ceilDiv(capScaled-tokens, rate))
	d.State = contract.State{Now: now, Tokens: tokens}
	return TokenBucketState{Tokens: tokens, Last: now}, d
}

// tokenBucketFill refills a level over elapsed µs without overflowing.
func tokenBucketFill(tokens, elapsed, capScaled, rate int64) int64 {
	if elapsed <= 0 {
		return min(tokens, capScaled)
	}
	if tokens >= capScaled || elapsed >= ceilDiv(capScaled-tokens, rate) {
		return capScaled
	}
	return tokens + elapsed*rate
}

// GCRAState is GCRA's stored state: the theoretical arrival time, TAT µs
// plus Rem/Limit µs (the emission interval Window/Limit is rarely a whole
// number of µs, and rounding it would let a burst of Limit fail). The zero
// value is a key never seen.
type GCRAState struct {
	TAT int64
	Rem int64 // 0 <= Rem < Limit
}

// GCRADecide applies one request at time now (µs) to GCRA.
func GCRADecide(p ratelimit.Policy, s GCRAState, now, cost int64, wt contract.Weight) (GCRAState, contract.Decision) {
	w, burst, rate := p.Window.Microseconds(), p.Capacity(), p.Limit
	tolerance := burst * w // in µs × rate units
	tat := s
	if tat.TAT < now || tat.TAT == now && tat.Rem == 0 {
		tat = GCRAState{TAT: now}
	}
	inc := scale(wt, cost*w)
	next := GCRAState{TAT: tat.TAT + inc/rate, Rem: tat.Rem + inc%rate}
	if next.Rem >= rate {
		next.TAT++
		next.Rem -= rate
	}
	d := contract.Decision{Decision: ratelimit.Decision{Limit: burst}}
	if ahead := (next.TAT-now)*rate + next.Rem; ahead <= tolerance {
		d.Allowed = true
		tat = next
	} else {
		d.RetryAfter = micros(ceilDiv(ahead-tolerance, rate))
	}
	ahead := (tat.TAT-now)*rate + tat.Rem
	d.Remaining = units(wt, tolerance-ahead, w)
	d.ResetAfter = micros(ceilDiv(ahead, rate))
	d.State = contract.State{Now: now, TAT: tat.TAT, TATRem: tat.Rem}
	return tat, d
}

// WindowCounterState is the sliding window counter's stored state. The zero
// value is a key never seen.
type WindowCounterState struct {
	WindowStart       int64 // µs since the epoch, aligned to the window
	Current, Previous int64
}

// WindowCounterDecide applies one request at time now (µs) to a sliding
// window counter. The previous window's count is weighted by the part of it
// that the sliding window still covers.
func WindowCounterDecide(p ratelimit.Policy, s WindowCounterState, now, cost int64, wt contract.Weight) (WindowCounterState, contract.Decision) {
	w, limit := p.Window.Microseconds(), limitOf(wt, p.Limit)
	start := now - now%w
	cur, prev := s.Shift(start, w)
	elapsed := now - start
	used := prev*(w-elapsed) + cur*w // in units × µs
	d := contract.Decision{Decision: ratelimit.Decision{Limit: p.Limit}}
	if used+cost*w <= limit*w {
		d.Allowed = true
		cur += cost
		used += cost * w
	} else {
		d.RetryAfter = micros(windowCounterRetry(w, limit, elapsed, cur, prev, cost))
	}
	d.Remaining = max(0, (limit*w-used)/w)
	switch {
	case cur > 0:
		d.ResetAfter = micros(2*w - elapsed)
	case prev > 0:
		d.ResetAfter = micros(w - elapsed)
	}
	d.State = contract.State{Now: now, WindowStart: start, Current: cur, Previous: prev}
	return WindowCounterState{WindowStart: start, Current: cur, Previous: prev}, d
}

// Shift returns the counts of the window starting at start and of the one
// before it, the stored windows moved forward to them (w is the window).
func (s WindowCounterState) Shift(start, w int64) (cur, prev int64) {
	switch s.WindowStart {
	case start:
		return s.Current, s.Previous
	case start - w:
		return 0, s.Current
	}
	return 0, 0
}

// windowCounterRetry is the time until cost units fit, for a denied request.
func windowCounterRetry(w, limit, elapsed, cur, prev, cost int64) int64 {
	if cost > limit { // never fits at this weight: look again in a window
		return w
	}
	// Later in this window the previous count's weight shrinks.
	if room := (limit - cost - cur) * w; room >= 0 && prev > 0 {
		at := w - room/prev // first elapsed µs with prev*(w-at) <= room
		if at < w {
			return at - elapsed
		}
	}
	// In the next window the current count becomes the previous one.
	at := int64(0)
	if cur > 0 {
		at = max(0, w-(limit-cost)*w/cur)
	}
	return w - elapsed + at
}

// WindowLog is the sliding window log's state in memory: the grant times,
// oldest first. The zero value is an empty log. Not safe for concurrent use.
type WindowLog struct {
	times []int64
}

// Len returns the number of grants held.
func (l *WindowLog) Len() int { return len(l.times) }

// WindowLogDecide applies one request at time now (µs) to a sliding window
// log, admitting it if at most Limit units fall in (now-Window, now].
func WindowLogDecide(p ratelimit.Policy, l *WindowLog, now, cost int64, wt contract.Weight) contract.Decision {
	w, limit := p.Window.Microseconds(), limitOf(wt, p.Limit)
	// Drop grants at or before now-w.
	drop := sort.Search(len(l.times), func(i int) bool { return l.times[i] > now-w })
	l.times = l.times[drop:]
	if len(l.times) == 0 {
		l.times = l.times[:0:0]
	} else if cap(l.times) > 2*len(l.times)+16 {
		l.times = append(make([]int64, 0, len(l.times)+int(cost)), l.times...)
	}
	count := int64(len(l.times))
	d := contract.Decision{Decision: ratelimit.Decision{Limit: p.Limit}}
	if count+cost <= limit {
		d.Allowed = true
		for range cost {
			// A clock that steps back must not unsort the log.
			l.times = append(l.times, max(now, last(l.times)))
		}
		count += cost
	} else if cost > limit {
		d.RetryAfter = micros(w) // never fits at this weight: look again in a window
	} else {
		// The (count+cost-limit)-th oldest grant must leave the window.
		d.RetryAfter = micros(l.times[count+cost-limit-1] + w - now)
	}
	d.Remaining = max(0, limit-count)
	if count > 0 {
		d.ResetAfter = micros(max(0, l.times[count-1]+w-now))
	}
	d.State = contract.State{Now: now, Ages: l.ages(now, w)}
	return d
}

// ages buckets the grants by age in eighths of the window. Bucket i holds the
// grants with times in (now - bound(i+1), now - bound(i)], bound(i) = i*w/8.
func (l *WindowLog) ages(now, w int64) [contract.AgeBuckets]int64 {
	var h [contract.AgeBuckets]int64
	upper := len(l.times)
	for i := range contract.AgeBuckets {
		lo := now - int64(i+1)*w/contract.AgeBuckets
		if i == contract.AgeBuckets-1 {
			lo = now - w
		}
		j := sort.Search(upper, func(k int) bool { return l.times[k] > lo })
		h[i] = int64(upper - j)
		upper = j
	}
	return h
}

func last(s []int64) int64 {
	if len(s) == 0 {
		return 0
	}
	return s[len(s)-1]
}

func norm(w contract.Weight) (int64, int64) {
	if w.Num == 0 {
		return 1, 1
	}
	return w.Num, w.Den
}

// scale returns ⌈x × Num/Den⌉.
func scale(w contract.Weight, x int64) int64 {
	n, d := norm(w)
	return ceilDiv(x*n, d)
}

// limitOf returns ⌊limit × Den/Num⌋.
func limitOf(w contract.Weight, limit int64) int64 {
	n, d := norm(w)
	return limit * d / n
}

// units returns how many unit requests (each scale(w, unit) long) fit in
// room.
func units(w contract.Weight, room, unit int64) int64 {
	if room <= 0 {
		return 0
	}
	return room / scale(w, unit)
}

// ceilDiv is ⌈a/b⌉ for a >= 0, b > 0; 0 for a <= 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
