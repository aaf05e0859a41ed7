// Package statekey keys per-identity state in process memory (the in-memory
// store and the resilient limiter's fallback budget).
package statekey

import (
	"encoding/binary"
	"hash/maphash"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// Key keys an identity's state under one policy in process memory: a
// 128-bit hash of the policy's name and state-shaping parameters and of the
// identity, so memory per key is fixed whatever the client sent.
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
	for _, v := range [...]int64{p.Limit, p.WindowMicros(), p.Capacity()} {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	b = append(b, id[:]...)
	return Key{maphash.Bytes(s[0], b), maphash.Bytes(s[1], b)}
}
