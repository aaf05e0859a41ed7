// The per-key entries (snapshot, fallback share, cached refusal), in shards
// that each have their own lock, so that concurrent decisions on different
// keys do not queue behind one mutex.

package resilient

import (
	"fmt"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// maxKeyShards bounds the number of shards; a small key capacity gets
// fewer (each shard holds at least one key).
const maxKeyShards = 64

// keyTable is a bounded map of key to *entry: an LRU per shard, the shard
// chosen by the key's hash. The shards' capacities add up to the configured
// capacity exactly.
type keyTable struct {
	shards []keyShard

	polMu    sync.Mutex
	policies map[ratelimit.Policy]*ratelimit.Policy // see policyRef
}

type keyShard struct {
	mu  sync.Mutex // guards lru and the entries in it; never held across I/O
	lru *simplelru.LRU[key, *entry]
	_   [48]byte // 8 + 8 + 48 = 64: neighbouring shards' locks on different cache lines
}

// newKeyTable returns a table of capacity keys; onEvict is called, with the
// shard's lock held, for each entry a full shard evicts.
func newKeyTable(capacity int, onEvict func(key, *entry)) (*keyTable, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("key capacity %d: must be positive", capacity)
	}
	n := min(maxKeyShards, capacity)
	t := &keyTable{shards: make([]keyShard, n), policies: map[ratelimit.Policy]*ratelimit.Policy{}}
	for i := range t.shards {
		c := capacity / n
		if i < capacity%n {
			c++
		}
		lru, err := simplelru.NewLRU[key, *entry](c, onEvict)
		if err != nil {
			return nil, err
		}
		t.shards[i].lru = lru
	}
	return t, nil
}

// shard returns the shard that holds k.
func (t *keyTable) shard(k key) *keyShard {
	return &t.shards[k[0]%uint64(len(t.shards))]
}

// entry returns k's entry, adding an empty one if there is none. s.mu must
// be held.
func (s *keyShard) entry(k key) *entry {
	e, _ := s.get(k)
	return e
}

// get returns k's entry, adding an empty one (fresh) if there is none. s.mu
// must be held.
func (s *keyShard) get(k key) (e *entry, fresh bool) {
	e, ok := s.lru.Get(k)
	if !ok {
		e = &entry{}
		s.lru.Add(k, e)
	}
	return e, !ok
}

// len is the number of keys held.
func (t *keyTable) len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += s.lru.Len()
		s.mu.Unlock()
	}
	return n
}

// each calls fn for every entry, one shard locked at a time.
func (t *keyTable) each(fn func(*entry)) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, e := range s.lru.Values() {
			fn(e)
		}
		s.mu.Unlock()
	}
}

// maxPolicies bounds how many distinct policies the limiter shares among
// its keys; policies beyond it get a copy per key.
const maxPolicies = 1024

// policyRef returns the table's one copy of p, so that keys of one policy
// do not each hold it.
func (t *keyTable) policyRef(p ratelimit.Policy) *ratelimit.Policy {
	t.polMu.Lock()
	defer t.polMu.Unlock()
	if r, ok := t.policies[p]; ok {
		return r
	}
	r := &p
	if len(t.policies) < maxPolicies {
		t.policies[p] = r
	}
	return r
}
