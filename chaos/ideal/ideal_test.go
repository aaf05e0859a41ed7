package ideal

import (
	"math/rand/v2"
	"testing"
)

type step struct {
	at   int64 // µs
	n    int   // requests at that instant
	want int   // how many of them are admitted
}

func runSteps(t *testing.T, p Policy, steps []step) {
	t.Helper()
	l, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range steps {
		got := 0
		for range s.n {
			if l.Allow(s.at) {
				got++
			}
		}
		if got != s.want {
			t.Errorf("step %d (t=%dµs, %d requests): %d admitted, want %d", i, s.at, s.n, got, s.want)
		}
	}
}

// Capacity 10 refilled at 10 per second: one token per 100 ms.
var bucketSteps = []step{
	{at: 1_000_000, n: 12, want: 10},   // a full bucket, then empty
	{at: 1_099_999, n: 1, want: 0},     // 0.99999 of a token
	{at: 1_100_000, n: 2, want: 1},     // exactly one token
	{at: 1_350_000, n: 3, want: 2},     // 2.5 tokens
	{at: 1_400_000, n: 1, want: 1},     // the half token and another half
	{at: 10_000_000, n: 11, want: 10},  // refilled, never above capacity
	{at: 10_050_000, n: 1, want: 0},    // half a token
	{at: 10_150_000, n: 2, want: 1},    // 1.5 tokens
	{at: 100_000_000, n: 10, want: 10}, // a long gap: capacity again
}

func TestTokenBucket(t *testing.T) {
	runSteps(t, Policy{Algorithm: TokenBucket, Limit: 10, WindowUS: 1_000_000}, bucketSteps)
}

func TestGCRA(t *testing.T) {
	runSteps(t, Policy{Algorithm: GCRA, Limit: 10, WindowUS: 1_000_000}, bucketSteps)
}

func TestBurstCapacity(t *testing.T) {
	// Capacity 5, rate 10 per second.
	steps := []step{{at: 0, n: 7, want: 5}, {at: 100_000, n: 2, want: 1}, {at: 10_000_000, n: 9, want: 5}}
	for _, alg := range []string{TokenBucket, GCRA} {
		t.Run(alg, func(t *testing.T) {
			runSteps(t, Policy{Algorithm: alg, Limit: 10, WindowUS: 1_000_000, Capacity: 5}, steps)
		})
	}
}

// TestTokenBucketEqualsGCRA: GCRA with the same burst and rate admits
// exactly what the token bucket admits, at any times.
func TestTokenBucketEqualsGCRA(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		limit := int64(1 + rng.IntN(200))
		w := int64(1_000 + rng.IntN(20_000_000))
		c := int64(rng.IntN(300))
		tb, _ := New(Policy{Algorithm: TokenBucket, Limit: limit, WindowUS: w, Capacity: c})
		g, _ := New(Policy{Algorithm: GCRA, Limit: limit, WindowUS: w, Capacity: c})
		now := int64(1_700_000_000_000_000)
		for i := range 3000 {
			now += int64(rng.IntN(int(w/limit) * 2))
			if a, b := tb.Allow(now), g.Allow(now); a != b {
				t.Fatalf("trial %d (limit %d, window %dµs, capacity %d), request %d at %d: token bucket %v, gcra %v",
					trial, limit, w, c, i, now, a, b)
			}
		}
	}
}

func TestSlidingWindowLog(t *testing.T) {
	runSteps(t, Policy{Algorithm: SlidingWindowLog, Limit: 3, WindowUS: 1000}, []step{
		{at: 0, n: 1, want: 1},
		{at: 1, n: 1, want: 1},
		{at: 2, n: 2, want: 1}, // the log is full
		{at: 999, n: 1, want: 0},
		{at: 1000, n: 1, want: 1}, // the grant at 0 left: (0, 1000]
		{at: 1000, n: 1, want: 0},
		{at: 1001, n: 1, want: 1}, // the one at 1 left
		{at: 1002, n: 2, want: 1}, // the one at 2 left
		{at: 5000, n: 4, want: 3}, // all gone
	})
}

func TestSlidingWindowCounter(t *testing.T) {
	// Limit 10 per aligned window of 1000 µs, the previous window weighted
	// by the share of it the sliding window still covers.
	runSteps(t, Policy{Algorithm: SlidingWindowCounter, Limit: 10, WindowUS: 1000}, []step{
		{at: 500, n: 12, want: 10},
		{at: 999, n: 1, want: 0},
		{at: 1000, n: 1, want: 0},   // prev 10 weighted 1.0
		{at: 1500, n: 6, want: 5},   // prev 10 × 0.5 = 5: room for 5
		{at: 1900, n: 5, want: 4},   // 10 × 0.1 + cur: room up to cur 9
		{at: 2000, n: 3, want: 1},   // prev 9 × 1.0: room for 1
		{at: 3999, n: 1, want: 1},   // prev 1 × 0.001 (window 3 after window 2)
		{at: 6000, n: 11, want: 10}, // two windows later: nothing counts
	})
}

// admit counts how many of n requests at now l admits.
func admit(l Limiter, now int64, n int) int {
	got := 0
	for range n {
		if l.Allow(now) {
			got++
		}
	}
	return got
}

// Switch carries a key's state across a policy change as the service does.
func TestSwitch(t *testing.T) {
	const w = 10_000_000 // 10 s
	switchTo := func(t *testing.T, l Limiter, now int64, p Policy) Limiter {
		t.Helper()
		n, err := Switch(l, now, p)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	t.Run("token bucket keeps its tokens, clamped", func(t *testing.T) {
		l, _ := New(Policy{Algorithm: TokenBucket, Limit: 150, WindowUS: w})
		if got := admit(l, 0, 40); got != 40 { // 110 tokens left
			t.Fatalf("admitted %d of 40", got)
		}
		l = switchTo(t, l, 0, Policy{Algorithm: TokenBucket, Limit: 100, WindowUS: w})
		if got := admit(l, 0, 200); got != 100 { // clamped to the new capacity
			t.Errorf("after lowering: %d admitted, want 100", got)
		}
		// Refilled at the new rate: 10 per second.
		if got := admit(l, 1_000_000, 20); got != 10 {
			t.Errorf("a second later: %d, want 10", got)
		}
		l = switchTo(t, l, 1_000_000, Policy{Algorithm: TokenBucket, Limit: 200, WindowUS: w})
		if got := admit(l, 1_000_000, 10); got != 0 { // kept: empty, not full
			t.Errorf("after raising: %d, want 0 (the tokens are kept)", got)
		}
		if got := admit(l, 2_000_000, 30); got != 20 {
			t.Errorf("a second after raising: %d, want 20", got)
		}
	})
	t.Run("GCRA keeps the time until it is full", func(t *testing.T) {
		l, _ := New(Policy{Algorithm: GCRA, Limit: 100, WindowUS: w})
		if got := admit(l, 0, 50); got != 50 { // full again in 5 s
			t.Fatalf("admitted %d of 50", got)
		}
		l = switchTo(t, l, 0, Policy{Algorithm: GCRA, Limit: 150, WindowUS: w})
		// Still 5 s until full: half the new capacity used, 75 left.
		if got := admit(l, 0, 100); got != 75 {
			t.Errorf("after raising: %d admitted, want 75", got)
		}
	})
	t.Run("window log keeps its entries", func(t *testing.T) {
		l, _ := New(Policy{Algorithm: SlidingWindowLog, Limit: 150, WindowUS: w})
		if got := admit(l, 0, 120); got != 120 {
			t.Fatalf("admitted %d of 120", got)
		}
		l = switchTo(t, l, 1, Policy{Algorithm: SlidingWindowLog, Limit: 100, WindowUS: w})
		if got := admit(l, 1, 10); got != 0 {
			t.Errorf("after lowering: %d, want 0 (120 in the window)", got)
		}
		if got := admit(l, w, 200); got != 100 {
			t.Errorf("a window later: %d, want 100", got)
		}
	})
	t.Run("window counter keeps its counts", func(t *testing.T) {
		l, _ := New(Policy{Algorithm: SlidingWindowCounter, Limit: 100, WindowUS: w})
		if got := admit(l, 0, 60); got != 60 {
			t.Fatalf("admitted %d of 60", got)
		}
		l = switchTo(t, l, 1, Policy{Algorithm: SlidingWindowCounter, Limit: 150, WindowUS: w})
		if got := admit(l, 1, 200); got != 90 {
			t.Errorf("after raising: %d, want 90", got)
		}
	})
	t.Run("a change of window or algorithm starts fresh", func(t *testing.T) {
		l, _ := New(Policy{Algorithm: SlidingWindowLog, Limit: 100, WindowUS: w})
		admit(l, 0, 100)
		if got := admit(switchTo(t, l, 1, Policy{Algorithm: SlidingWindowLog, Limit: 100, WindowUS: w / 2}), 1, 200); got != 100 {
			t.Errorf("another window: %d, want a fresh 100", got)
		}
		if got := admit(switchTo(t, l, 1, Policy{Algorithm: SlidingWindowCounter, Limit: 100, WindowUS: w}), 1, 200); got != 100 {
			t.Errorf("another algorithm: %d, want a fresh 100", got)
		}
	})
}
