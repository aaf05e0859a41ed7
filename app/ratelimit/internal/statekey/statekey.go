// Package statekey keys per-identity state in process memory (the in-memory
// store and the resilient limiter's fallback budget).
package statekey

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"strconv"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// Key keys an identity's state under one policy in process memory: a
// 128-bit hash of the policy's name, algorithm and window (what the Redis
// store's policy fingerprint covers) and of the identity, so memory per
// key is fixed whatever the client sent.
type Key [2]uint64

// Seeds are the per-process seeds of Key hashes. Make them with
// NewSeeds.
type Seeds [2]maphash.Seed

// NewSeeds returns fresh random seeds.
func NewSeeds() Seeds { return Seeds{maphash.MakeSeed(), maphash.MakeSeed()} }

// Key returns the state key of identity id under policy p. It does not
// allocate for policy names of up to 40 bytes: the bytes are put together
// on the stack and hashed once per seed.
func (s *Seeds) Key(p ratelimit.Policy, id store.Identity) Key {
	var buf [128]byte
	b := append(buf[:0], p.Name...)
	b = append(b, 0)
	b = append(b, p.Algorithm...)
	// Not the limit nor the capacity: a key keeps its usage across a
	// reload that changes them (as in the Redis store's keys).
	b = binary.LittleEndian.AppendUint64(b, uint64(p.Window.Microseconds()))
	b = append(b, id[:]...)
	return Key{maphash.Bytes(s[0], b), maphash.Bytes(s[1], b)}
}

// Params is a short hash of every parameter of p that its decisions depend
// on (algorithm, limit, window, capacity): it tells the grants of a policy
// reloaded with other parameters from the old one's (journal batches, replay
// markers). Stored state is keyed by the policy's name, algorithm and
// window, which leave out the limit and the capacity, so that usage
// carries over such a reload.
func Params(p ratelimit.Policy) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(string(p.Algorithm) + "|" + strconv.FormatInt(p.Limit, 10) + "|" +
		strconv.FormatInt(p.Window.Microseconds(), 10) + "|" + strconv.FormatInt(p.Capacity(), 10)))
	return fmt.Sprintf("%08x", h.Sum32())
}
