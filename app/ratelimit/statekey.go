package ratelimit

import (
	"encoding/binary"
	"hash/maphash"
)

// StateKey keys an identity's state under one policy in process memory: a
// 128-bit hash of the policy's name and state-shaping parameters and of the
// identity, so memory per key is fixed whatever the client sent.
type StateKey [2]uint64

// StateKeySeeds are the per-process seeds of StateKey hashes. Make them with
// NewStateKeySeeds.
type StateKeySeeds [2]maphash.Seed

// NewStateKeySeeds returns fresh random seeds.
func NewStateKeySeeds() StateKeySeeds { return StateKeySeeds{maphash.MakeSeed(), maphash.MakeSeed()} }

// Key returns the state key of identity id under policy p. It does not
// allocate.
func (s *StateKeySeeds) Key(p Policy, id Identity) StateKey {
	var k StateKey
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
