package topk

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// t0 is the start of a period (of 30 s: the default window's half).
var t0 = time.Unix(1_700_000_010, 0)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// TestTopExactBelowK: with fewer than K distinct identities in the window,
// every count is exact and every error 0, across both periods.
func TestTopExactBelowK(t *testing.T) {
	tr := New(DefaultK, DefaultWindow)
	for _, step := range []struct {
		at       float64
		identity string
		times    int
	}{
		{0, "k:a", 3},
		{1, "ip:192.0.2.1", 7},
		{2, "k:b", 1},
		{29.9, "k:a", 2},
		{30, "k:a", 4}, // the next period: a's 5 move to the previous table
		{31, "k:c", 5},
		{40, "ip:192.0.2.1", 1},
	} {
		for range step.times {
			tr.Observe(at(step.at), "p", step.identity)
		}
	}
	tr.Observe(at(41), "other", "k:a")
	want := []Entry{{"k:a", 9, 0}, {"ip:192.0.2.1", 8, 0}, {"k:c", 5, 0}, {"k:b", 1, 0}}
	if got := tr.Top(at(45), "p", 10); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Top: %v, want %v", got, want)
	}
	if got := tr.Top(at(45), "p", 2); fmt.Sprint(got) != fmt.Sprint(want[:2]) {
		t.Errorf("Top n=2: %v, want %v", got, want[:2])
	}
	if got := tr.Top(at(45), "other", 10); fmt.Sprint(got) != "[{k:a 1 0}]" {
		t.Errorf("Top of other: %v", got)
	}
	if got := tr.Top(at(45), "unknown", 10); got != nil {
		t.Errorf("Top of a policy never seen: %v", got)
	}
	if got := tr.Policies(at(45)); fmt.Sprint(got) != "[other p]" {
		t.Errorf("Policies: %v", got)
	}
}

// TestTopHeavyHitters: three identities refused 1000, 900 and 800 times,
// spread evenly among 10 000 identities refused once each (N = 12 700,
// N/K = 793 < 800), are the top three in order, each within Space-Saving's
// bound (refused - error ≤ true ≤ refused), both when the stream falls in
// one period and when it is split over two (merged tables). The brief's
// case, three identities refused 500 times each among the same 10 000, is
// guaranteed with K = 32 (N/K = 359): it runs too.
func TestTopHeavyHitters(t *testing.T) {
	for _, c := range []struct {
		name  string
		k     int
		heavy []int // true refusals of h0, h1, ...
		split bool  // the second half of the stream in the next period
	}{
		{"one period", DefaultK, []int{1000, 900, 800}, false},
		{"two periods", DefaultK, []int{1000, 900, 800}, true},
		{"3x500 K=32", 32, []int{500, 500, 500}, false},
		{"3x500 K=32 two periods", 32, []int{500, 500, 500}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := New(c.k, DefaultWindow)
			truth := map[string]uint64{}
			var stream []string
			for i := range 10_000 {
				stream = append(stream, fmt.Sprintf("k:single-%05d", i))
			}
			// Interleave each heavy identity's refusals evenly.
			for h, n := range c.heavy {
				id := fmt.Sprintf("k:heavy-%d", h)
				var merged []string
				step := float64(len(stream)+n) / float64(n)
				next, placed := step/2, 0
				for _, s := range stream {
					for placed < n && float64(len(merged)) >= next {
						merged = append(merged, id)
						placed++
						next += step
					}
					merged = append(merged, s)
				}
				for ; placed < n; placed++ {
					merged = append(merged, id)
				}
				stream = merged
			}
			for i, id := range stream {
				now := at(1)
				if c.split && i >= len(stream)/2 {
					now = at(31)
				}
				tr.Observe(now, "p", id)
				truth[id]++
			}
			got := tr.Top(at(40), "p", c.k)
			if len(got) != c.k {
				t.Fatalf("Top: %d entries, want K = %d", len(got), c.k)
			}
			for i, e := range got {
				if tr := truth[e.Identity]; e.Refused-e.Error > tr || tr > e.Refused || e.Error > e.Refused {
					t.Errorf("%d: %+v: true %d outside [refused-error, refused]", i, e, tr)
				}
			}
			for h := range c.heavy {
				want := fmt.Sprintf("k:heavy-%d", h)
				if len(c.heavy) > 1 && c.heavy[0] == c.heavy[1] {
					// Equal true counts: any order of the three.
					if !strings.HasPrefix(got[h].Identity, "k:heavy-") {
						t.Errorf("#%d: %+v, want a heavy identity", h, got[h])
					}
					continue
				}
				if got[h].Identity != want {
					t.Errorf("#%d: %+v, want %s", h, got[h], want)
				}
			}
			t.Logf("top 4: %+v", got[:4])
		})
	}
}

// TestTopWindow: refusals count while their period or the next is current,
// and are gone two periods on; an observation after a gap of two periods
// or more clears both tables; a clock that steps back counts in the
// current period.
func TestTopWindow(t *testing.T) {
	tr := New(DefaultK, DefaultWindow)
	steps := []struct {
		at       float64
		observe  string // "" only reads
		want     string // Top(p) at that instant
		policies string
		since    float64
	}{
		{0, "k:a", "[{k:a 1 0}]", "[p]", -30},
		{29.999, "", "[{k:a 1 0}]", "[p]", -30},
		{30, "", "[{k:a 1 0}]", "[p]", 0},              // a's period is the previous one
		{35, "k:b", "[{k:a 1 0} {k:b 1 0}]", "[p]", 0}, // rotates: a in prev, b in cur
		{59.999, "", "[{k:a 1 0} {k:b 1 0}]", "[p]", 0},
		{60, "", "[{k:b 1 0}]", "[p]", 30}, // a is older than the window
		{89.999, "", "[{k:b 1 0}]", "[p]", 30},
		{90, "", "[]", "[]", 60},
		{150, "k:c", "[{k:c 1 0}]", "[p]", 120}, // two periods on: both cleared
		{140, "k:c", "[{k:c 2 0}]", "[p]", 90},  // the clock stepped back
	}
	for _, s := range steps {
		if s.observe != "" {
			tr.Observe(at(s.at), "p", s.observe)
		}
		if got := tr.Top(at(s.at), "p", DefaultK); fmt.Sprint(got) != s.want {
			t.Errorf("at %vs: Top %v, want %s", s.at, got, s.want)
		}
		if got := tr.Policies(at(s.at)); fmt.Sprint(got) != s.policies {
			t.Errorf("at %vs: Policies %v, want %s", s.at, got, s.policies)
		}
		if got := tr.Since(at(s.at)); !got.Equal(at(s.since)) {
			t.Errorf("at %vs: Since %v, want %v", s.at, got, at(s.since))
		}
	}
	if n := tr.Entries(); n != 1 {
		t.Errorf("Entries after the clear: %d, want 1 (k:c)", n)
	}
}

// TestObserveMemoryBound: however many identities (and however long), no table
// holds more than K entries nor more than MaxIdentityBytes of one, and
// Entries never exceeds 2·K per policy; policies are capped at MaxPolicies,
// and one without refusals in the window gives its place to a new one.
func TestObserveMemoryBound(t *testing.T) {
	const k = 8
	tr := New(k, DefaultWindow)
	policies := []string{"p1", "p2", "p3"}
	check := func(when string) {
		t.Helper()
		if n := tr.Entries(); n > 2*k*len(policies) {
			t.Fatalf("%s: %d entries, want at most %d", when, n, 2*k*len(policies))
		}
		for name, p := range *tr.policies.Load() {
			for _, tb := range []*table{&p.cur, &p.prev} {
				if tb.n > k || len(tb.entries) != k || len(tb.hashes) != k {
					t.Fatalf("%s: policy %s: a table of %d entries (%d slots), want at most %d", when, name, tb.n, len(tb.entries), k)
				}
				for _, e := range tb.entries {
					if len(e.id) > MaxIdentityBytes {
						t.Fatalf("%s: an identity of %d bytes kept", when, len(e.id))
					}
				}
			}
		}
	}
	long := strings.Repeat("x", 10_000)
	for i := range 100_000 {
		now := at(float64(i) / 1000) // 100 s: four periods
		id := fmt.Sprintf("ip:%d", i)
		if i%1000 == 0 {
			id = long + id
		}
		tr.Observe(now, policies[i%len(policies)], id)
		if i%997 == 0 {
			check(fmt.Sprintf("after %d", i+1))
		}
	}
	check("at the end")
	if n := tr.Entries(); n != 2*k*len(policies) {
		t.Errorf("Entries: %d, want every table full (%d)", n, 2*k*len(policies))
	}
	// A long identity counts under its first MaxIdentityBytes bytes.
	tr.Observe(at(100), "long", long+"a")
	tr.Observe(at(100), "long", long+"b")
	if got := tr.Top(at(100), "long", k); len(got) != 1 || got[0].Identity != long[:MaxIdentityBytes] || got[0].Refused != 2 {
		t.Errorf("long identities: %d entries, first %.20s... (%d bytes)", len(got), got[0].Identity, len(got[0].Identity))
	}

	// MaxPolicies.
	many := New(k, DefaultWindow)
	for i := range MaxPolicies + 10 {
		many.Observe(at(0), fmt.Sprintf("p%d", i), "k:a")
	}
	if n := len(many.Policies(at(0))); n != MaxPolicies {
		t.Errorf("%d policies tracked, want MaxPolicies", n)
	}
	many.Observe(at(70), "late", "k:a") // the others' refusals are older than the window
	if got := many.Policies(at(70)); fmt.Sprint(got) != "[late]" || len(*many.policies.Load()) != 1 {
		t.Errorf("after the window: %v (%d in the map), want [late] alone", got, len(*many.policies.Load()))
	}
}

// TestObserveAllocs: a refusal of an identity in the table allocates
// nothing, nor does one that replaces an entry once the entries' buffers
// are long enough (the steady state of many distinct identities).
func TestObserveAllocs(t *testing.T) {
	tr := New(DefaultK, DefaultWindow)
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprintf("k:id-%04d", i)
	}
	for _, id := range ids { // warm: every entry's buffer holds such an id
		tr.Observe(at(1), "p", id)
	}
	if a := testing.AllocsPerRun(1000, func() { tr.Observe(at(2), "p", ids[len(ids)-1]) }); a != 0 {
		t.Errorf("a refusal of an identity in the table: %v allocations, want 0", a)
	}
	i := 0
	if a := testing.AllocsPerRun(1000, func() { tr.Observe(at(3), "p", ids[i%len(ids)]); i++ }); a != 0 {
		t.Errorf("a refusal replacing an entry: %v allocations, want 0", a)
	}
}

// TestConcurrentObserve: refusals from many goroutines are all counted
// (exact below K); run it with -race.
func TestConcurrentObserve(t *testing.T) {
	tr := New(DefaultK, DefaultWindow)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				tr.Observe(at(1), []string{"p", "q"}[g%2], fmt.Sprintf("k:%d", i%4))
			}
		})
	}
	wg.Wait()
	for _, p := range []string{"p", "q"} {
		got := tr.Top(at(1), p, DefaultK)
		if len(got) != 4 {
			t.Fatalf("%s: %v, want 4 identities", p, got)
		}
		for _, e := range got {
			if e.Refused != 1000 || e.Error != 0 {
				t.Errorf("%s: %+v, want 1000 refusals, error 0", p, e)
			}
		}
	}
}

// BenchmarkObserve: one refusal. hit: the identity is in the table; miss:
// every refusal a new identity (10 000 in turn), which replaces the
// smallest entry; parallel: hits from every P over four policies.
func BenchmarkObserve(b *testing.B) {
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("k:bench-id-%05d", i)
	}
	now := at(1)
	b.Run("hit", func(b *testing.B) {
		tr := New(DefaultK, DefaultWindow)
		for _, id := range ids[:DefaultK] {
			tr.Observe(now, "p", id)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			tr.Observe(now, "p", ids[i%DefaultK])
			i++
		}
	})
	b.Run("miss", func(b *testing.B) {
		tr := New(DefaultK, DefaultWindow)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			tr.Observe(now, "p", ids[i%len(ids)])
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		tr := New(DefaultK, DefaultWindow)
		policies := []string{"p1", "p2", "p3", "p4"}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				tr.Observe(now, policies[i%len(policies)], ids[i%DefaultK])
				i++
			}
		})
	})
}
