// Package memstore is the in-memory backend: the algorithms of package
// ratelimit applied to state held in process memory, bounded by a key
// capacity with least-recently-used eviction.
//
// It serves a single instance without a shared store (mode "memory"); the
// resilient limiter uses the same transitions for its fallback budget.
package memstore

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/statekey"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// defaultCapacity is the number of keys held when no capacity is set.
const defaultCapacity = 100_000

// Store is an in-memory ratelimit.Limiter. It is safe for concurrent use;
// decisions are serialised by one mutex (a decision takes well under a
// microsecond, and no I/O happens under the lock). Use New; the zero value is
// not usable.
type Store struct {
	now       func() time.Time
	seeds     statekey.Seeds
	evictions atomic.Uint64

	capacity int

	mu   sync.Mutex
	keys *simplelru.LRU[statekey.Key, *entry]
}

var _ ratelimit.Limiter = (*Store)(nil)

// entry is one key's state; only the policy's algorithm's field is used.
type entry struct {
	tb      algorithm.TokenBucketState
	gc      algorithm.GCRAState
	wc      algorithm.WindowCounterState
	log     algorithm.WindowLog
	markers []string // replay batches applied to this key
}

// Config configures a Store. The zero Config is the default.
type Config struct {
	// Capacity bounds the number of keys held (default 100 000); the
	// least recently used key is evicted beyond it, and starts again from
	// a full quota when seen next.
	Capacity int
	// Clock is the time decisions are made at (default time.Now; tests
	// move time by passing a func).
	Clock func() time.Time
}

// New returns an in-memory limiter. It panics on a negative capacity,
// which is a programming error.
func New(cfg Config) *Store {
	l := &Store{now: cfg.Clock, seeds: statekey.NewSeeds(), capacity: cmp.Or(cfg.Capacity, defaultCapacity)}
	if l.now == nil {
		l.now = time.Now
	}
	keys, err := simplelru.NewLRU[statekey.Key, *entry](l.capacity, func(statekey.Key, *entry) { l.evictions.Add(1) })
	if err != nil {
		panic("memstore: " + err.Error())
	}
	l.keys = keys
	return l
}

func (l *Store) keyOfIdentity(p ratelimit.Policy, id store.Identity) statekey.Key {
	return l.seeds.Key(p, id)
}

// Decide applies the request's policy to its key at the limiter's clock.
func (l *Store) Decide(_ context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	d, err := l.decide(contract.Request{Request: req})
	return d.Decision, err
}

// decide is Decide with the request's weight, and the state in the
// decision (the extension's DecideWire).
func (l *Store) decide(req contract.Request) (contract.Decision, error) {
	if err := req.Validate(); err != nil {
		return contract.Decision{}, err
	}
	return l.decideAt(l.keyOfIdentity(req.Policy, store.IdentityOf(req.Key)), req.Policy, l.now().UnixMicro(), req.Units(), req.Weight), nil
}

// decideAt applies a validated policy to key at time now (µs since the
// epoch).
func (l *Store) decideAt(key statekey.Key, p ratelimit.Policy, now, cost int64, wt contract.Weight) contract.Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.keys.Get(key)
	if !ok {
		e = &entry{}
		l.keys.Add(key, e)
	}
	var d contract.Decision
	switch p.Algorithm {
	case ratelimit.TokenBucket:
		e.tb, d = algorithm.TokenBucketDecide(p, e.tb, now, cost, wt)
	case ratelimit.GCRA:
		e.gc, d = algorithm.GCRADecide(p, e.gc, now, cost, wt)
	case ratelimit.SlidingWindowCounter:
		e.wc, d = algorithm.WindowCounterDecide(p, e.wc, now, cost, wt)
	case ratelimit.SlidingWindowLog:
		d = algorithm.WindowLogDecide(p, &e.log, now, cost, wt)
	}
	d.Mode = ratelimit.ModeMemory
	return d
}

// Stats returns the number of keys held and how many keys were evicted so
// far to stay within the capacity.
func (l *Store) Stats() (keys int, evictions uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keys.Len(), l.evictions.Load()
}

// maxMarkers bounds the replay markers remembered per key.
const maxMarkers = 16

// replay folds journaled grants into the in-memory state with the same
// transitions as the Redis replay scripts, each batch at most once per key
// (the last maxMarkers markers of a key are remembered). It makes memstore a
// complete twin of the Redis store for tests.
func (l *Store) replay(_ context.Context, batches []store.ReplayBatch) ([]store.ReplayResult, []error) {
	results, errs := make([]store.ReplayResult, len(batches)), make([]error, len(batches))
	now := l.now().UnixMicro()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, b := range batches {
		if err := b.Policy.Validate(); err != nil {
			errs[i] = err
			continue
		}
		k := l.keyOfIdentity(b.Policy, b.Identity)
		e, ok := l.keys.Get(k)
		if !ok {
			e = &entry{}
			l.keys.Add(k, e)
		}
		if slices.Contains(e.markers, b.Marker) {
			results[i].Duplicate = true
			for _, g := range b.Grants {
				results[i].DuplicateUnits += g.Cost
			}
			continue
		}
		e.markers = append(e.markers, b.Marker)
		if len(e.markers) > maxMarkers {
			e.markers = e.markers[1:]
		}
		grants := slices.Clone(b.Grants)
		algorithm.SortGrants(grants)
		switch p := b.Policy; p.Algorithm {
		case ratelimit.TokenBucket:
			e.tb, results[i] = algorithm.TokenBucketReplay(p, e.tb, now, grants)
		case ratelimit.GCRA:
			e.gc, results[i] = algorithm.GCRAReplay(p, e.gc, now, grants)
		case ratelimit.SlidingWindowCounter:
			e.wc, results[i] = algorithm.WindowCounterReplay(p, e.wc, now, grants)
		case ratelimit.SlidingWindowLog:
			results[i] = algorithm.WindowLogReplay(p, &e.log, now, grants)
		}
	}
	return results, errs
}

// Reset lifts identity's limits under policies: their state is forgotten,
// as if never seen (in place: a reset is not an eviction). An invalid
// identity or policy is an error, and nothing is reset.
func (l *Store) Reset(_ context.Context, identity string, policies ...ratelimit.Policy) error {
	if err := contract.ValidateKey(identity); err != nil {
		return err
	}
	for _, p := range policies {
		if err := p.Validate(); err != nil {
			return err
		}
	}
	id := store.IdentityOf(identity)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range policies {
		if e, ok := l.keys.Peek(l.keyOfIdentity(p, id)); ok {
			*e = entry{}
		}
	}
	return nil
}
