// Package statekey keys per-identity state in process memory (the in-memory
// store and the resilient limiter's fallback budget).
package statekey

import (
	"encoding/binary"
	"hash/maphash"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
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
// allocate.
func (s *Seeds) Key(p ratelimit.Policy, id ratelimit.Identity) Key {
	var k Key
	for i := range k {
		var h maphash.Hash
		h.SetSeed(s[i])
		_, _ = h.WriteString(p.Name)
		_ = h.WriteByte(0)
		_, _ = h.WriteString(string(p.Algorithm))
		for _, v := range [...]int64{p.Limit, p.WindowMicros(), p.Capacity()} {
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], uint64(v))
			_, _ = h.Write(b[:])
		}
		_, _ = h.Write(id[:])
		k[i] = h.Sum64()
	}
	return k
}
