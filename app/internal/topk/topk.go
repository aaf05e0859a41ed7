// Package topk keeps, per policy, the identities a rate limiter refused most
// often over the last window (a minute in the service), in memory bounded by
// a fixed number of entries per policy whatever the identities.
//
// # Space-Saving
//
// Each table is a Space-Saving sketch (Metwally, Agrawal and El Abbadi,
// "Efficient computation of frequent and top-k elements in data streams",
// 2005) of at most K entries, each an identity with a count and an error.
// An identity already in the table adds 1 to its count. A new one takes a
// free entry (count 1, error 0) or, when all K are taken, the entry with
// the smallest count m, which becomes the new identity's with count m+1 and
// error m. So for every identity reported,
//
//	refused - error ≤ true refusals ≤ refused,
//
// an identity not in a table was refused at most as often as that table's
// smallest count, and any identity refused more than N/K times (N: the
// policy's refusals in the period) is in it. With at most K distinct
// identities in a period every count is exact and every error 0.
//
// # Window
//
// Time is cut into periods of half the window, aligned to the Unix epoch
// (period number = now / period). Each policy has two tables, the current
// period's and the previous one's. An observation in the next period makes
// the current table the previous one and starts an empty current one; one
// two or more periods later clears both. Top reports the two tables merged:
// the refusals since the start of the previous period (Since), that is at
// least the last half window and at most the last whole window (30 to 60 s
// for a minute). A clock that steps back counts in the current period.
//
// # Memory
//
// Per policy: two tables of K entries, each entry 48 bytes plus its
// identity's bytes (identities are copied, at most MaxIdentityBytes, so a
// caller's buffer is never kept). At most MaxPolicies policies; a policy
// without refusals in the window is dropped when a new one needs its place.
//
// A refusal of an identity in the current table allocates nothing, nor does
// one that replaces an entry whose buffer is already as long as the new
// identity (the steady state); a table allocates when it is created (a
// policy's first refusal) and when an entry takes an identity longer than
// any it held before.
package topk

import (
	"cmp"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of New.
const (
	// DefaultK is the number of identities kept per policy and period.
	DefaultK = 16
	// DefaultWindow is how far back Top looks at most.
	DefaultWindow = time.Minute
)

// MaxIdentityBytes bounds the bytes kept of an identity: a longer one
// counts under its first MaxIdentityBytes bytes. It is
// ratelimit.MaxKeyBytes, the longest key a limiter accepts, so the service
// never reaches it.
const MaxIdentityBytes = 256

// MaxPolicies bounds the policies tracked at once. A refusal under a new
// policy when MaxPolicies policies have refusals in the window is not
// counted. The service's policies are a configured set, far fewer.
const MaxPolicies = 1024

// Entry is one identity of a ranking.
type Entry struct {
	Identity string
	// Refused is an upper bound of the identity's refusals in the window;
	// Refused - Error is a lower bound.
	Refused uint64
	Error   uint64
}

// Tracker counts refusals per policy and identity and ranks them. It is
// safe for concurrent use: observations of different policies do not
// contend, those of one policy hold its lock for one table scan. The zero
// value is not usable; call New.
type Tracker struct {
	k      int
	period time.Duration
	seed   maphash.Seed

	mu       sync.Mutex                            // serialises adding a policy
	policies atomic.Pointer[map[string]*policyTop] // copied on write
}

// New returns a Tracker that keeps k identities per policy and period and
// looks back at most window (two periods of window/2). A k below 1 means
// DefaultK; a window under 2 ns means DefaultWindow.
func New(k int, window time.Duration) *Tracker {
	if k < 1 {
		k = DefaultK
	}
	if window < 2 {
		window = DefaultWindow
	}
	t := &Tracker{k: k, period: window / 2, seed: maphash.MakeSeed()}
	t.policies.Store(&map[string]*policyTop{})
	return t
}

// K is the number of identities kept per policy and period: the most Top
// returns.
func (t *Tracker) K() int { return t.k }

// Window is how far back Top looks at most: two periods.
func (t *Tracker) Window() time.Duration { return 2 * t.period }

// Since returns the start of the time Top covers at now: the start of the
// period before now's.
func (t *Tracker) Since(now time.Time) time.Time {
	return time.Unix(0, (t.epoch(now)-1)*int64(t.period))
}

func (t *Tracker) epoch(now time.Time) int64 { return now.UnixNano() / int64(t.period) }

// Observe counts one refusal of identity under policy at now.
func (t *Tracker) Observe(now time.Time, policy, identity string) {
	if len(identity) > MaxIdentityBytes {
		identity = identity[:MaxIdentityBytes]
	}
	h := maphash.String(t.seed, identity)
	e := t.epoch(now)
	for {
		p := (*t.policies.Load())[policy]
		if p == nil {
			if p = t.add(policy, e); p == nil {
				return // MaxPolicies policies with refusals in the window
			}
		}
		p.mu.Lock()
		if p.dropped {
			// Dropped from the map between the lookup and the lock: count
			// in the policy's new table.
			p.mu.Unlock()
			continue
		}
		p.rotate(e)
		p.cur.observe(h, identity)
		p.mu.Unlock()
		return
	}
}

// add returns policy's tables, creating them: in a copy of the map without
// the policies that have no refusals in the window at period e. nil when
// MaxPolicies others have.
func (t *Tracker) add(policy string, e int64) *policyTop {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.policies.Load()
	if p := old[policy]; p != nil {
		return p
	}
	next := make(map[string]*policyTop, len(old)+1)
	for name, p := range old {
		p.mu.Lock()
		if p.epoch < e-1 {
			p.dropped = true
		} else {
			next[name] = p
		}
		p.mu.Unlock()
	}
	if len(next) >= MaxPolicies {
		return nil
	}
	p := &policyTop{epoch: e, cur: newTable(t.k), prev: newTable(t.k)}
	next[policy] = p
	t.policies.Store(&next)
	return p
}

// Policies returns, sorted, the policies with refusals in the window at now.
func (t *Tracker) Policies(now time.Time) []string {
	e := t.epoch(now)
	var out []string
	for name, p := range *t.policies.Load() {
		p.mu.Lock()
		cur, prev := p.view(e)
		if cur != nil && cur.n > 0 || prev != nil && prev.n > 0 {
			out = append(out, name)
		}
		p.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// Top returns at most n (at most K) of the identities refused most under
// policy in the window at now, most refused first (ties: smaller error,
// then identity). It counts nothing and changes nothing.
//
// The two periods' tables are merged as mergeable summaries are: an
// identity missing from a full table gets that table's smallest count as
// both count and error (it may have been refused up to that often there),
// one missing from a table with free entries 0 (it was not refused then).
// The bound refused - error ≤ true ≤ refused holds for the sum.
func (t *Tracker) Top(now time.Time, policy string, n int) []Entry {
	p := (*t.policies.Load())[policy]
	if p == nil || n < 1 {
		return nil
	}
	n = min(n, t.k)
	type side struct {
		entries []Entry
		floor   uint64 // count and error of an identity not in the table
	}
	var sides [2]side
	p.mu.Lock()
	cur, prev := p.view(t.epoch(now))
	for i, tb := range [2]*table{cur, prev} {
		if tb == nil || tb.n == 0 {
			continue
		}
		s := &sides[i]
		s.entries = make([]Entry, tb.n)
		for j := range tb.n {
			en := &tb.entries[j]
			s.entries[j] = Entry{Identity: string(en.id), Refused: en.count, Error: en.err}
		}
		if tb.n == len(tb.entries) {
			s.floor = tb.minCount()
		}
	}
	p.mu.Unlock()

	// Each identity's count and error in cur, plus prev's in prev; a
	// table it is missing from adds that table's floor.
	type sum struct {
		Entry
		inPrev bool
	}
	merged := make(map[string]*sum, len(sides[0].entries)+len(sides[1].entries))
	for _, en := range sides[0].entries {
		merged[en.Identity] = &sum{Entry: en}
	}
	for _, en := range sides[1].entries {
		if m := merged[en.Identity]; m != nil {
			m.Refused += en.Refused
			m.Error += en.Error
			m.inPrev = true
			continue
		}
		en.Refused += sides[0].floor
		en.Error += sides[0].floor
		merged[en.Identity] = &sum{Entry: en, inPrev: true}
	}
	for _, m := range merged {
		if !m.inPrev {
			m.Refused += sides[1].floor
			m.Error += sides[1].floor
		}
	}
	out := make([]Entry, 0, len(merged))
	for _, m := range merged {
		out = append(out, m.Entry)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(b.Refused, a.Refused), cmp.Compare(a.Error, b.Error), cmp.Compare(a.Identity, b.Identity))
	})
	return out[:min(n, len(out))]
}

// Entries returns how many entries the tracker holds, over every policy
// and both periods (expired ones included until the policy's next
// refusal): never more than 2·K per policy.
func (t *Tracker) Entries() int {
	total := 0
	for _, p := range *t.policies.Load() {
		p.mu.Lock()
		total += p.cur.n + p.prev.n
		p.mu.Unlock()
	}
	return total
}

// policyTop is one policy's two tables.
type policyTop struct {
	mu        sync.Mutex
	epoch     int64 // cur's period
	cur, prev table
	dropped   bool // no longer in the map: look it up again
}

// rotate makes cur the table of period e.
func (p *policyTop) rotate(e int64) {
	switch {
	case e <= p.epoch: // the same period, or a clock that stepped back
		return
	case e == p.epoch+1:
		p.cur, p.prev = p.prev, p.cur
		p.cur.n = 0
	default:
		p.cur.n, p.prev.n = 0, 0
	}
	p.epoch = e
}

// view returns the tables of period e and the one before (nil: none).
func (p *policyTop) view(e int64) (cur, prev *table) {
	switch {
	case e <= p.epoch:
		return &p.cur, &p.prev
	case e == p.epoch+1:
		return nil, &p.cur
	}
	return nil, nil
}

// table is a Space-Saving sketch: entries[:n] are in use. hashes holds
// each entry's identity hash, apart, so a lookup scans K words.
type table struct {
	n       int
	hashes  []uint64
	entries []entry
}

type entry struct {
	count, err uint64
	id         []byte // kept across replacements, so the buffer is reused
}

func newTable(k int) table {
	return table{hashes: make([]uint64, k), entries: make([]entry, k)}
}

func (tb *table) observe(h uint64, identity string) {
	for i, x := range tb.hashes[:tb.n] {
		if x == h && string(tb.entries[i].id) == identity {
			tb.entries[i].count++
			return
		}
	}
	i, count := tb.n, uint64(0)
	if tb.n < len(tb.entries) {
		tb.n++
	} else {
		i = tb.minIndex()
		count = tb.entries[i].count
	}
	en := &tb.entries[i]
	tb.hashes[i] = h
	en.id = append(en.id[:0], identity...)
	en.count, en.err = count+1, count
}

// minIndex returns the entry with the smallest count (the first of equals).
func (tb *table) minIndex() int {
	m := 0
	for i := 1; i < tb.n; i++ {
		if tb.entries[i].count < tb.entries[m].count {
			m = i
		}
	}
	return m
}

func (tb *table) minCount() uint64 { return tb.entries[tb.minIndex()].count }
