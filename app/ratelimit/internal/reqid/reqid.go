// Package reqid mints request ids (ratelimit.Request.ID) for the requests
// that come without one: the sliding window log stores the id as the
// grant's member, the journal and the late replies follow a request by it,
// and redisstore takes a request with the id of one it admitted moments
// before for a resend. So an id must be unique across the fleet and across
// restarts, and hold only bytes that httplimit.ValidRequestID accepts.
//
// Ids a client sees (httplimit's X-Request-Id) come from Random; ids that
// stay inside the fleet come from a Minter, which is cheaper.
package reqid

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/shortname"
)

// Random returns 32 random hex digits, the shape of nginx's $request_id.
// It tells nothing of the requests before it, so a client may see it.
func Random() string { return randomHex(16) }

// Minter mints ids: its base (a prefix, 12 random hex digits and a '-'),
// then a counter in base 36. The random part keeps two minters apart, in
// other processes or after a restart, whatever their prefix. Safe for
// concurrent use.
type Minter struct {
	base string
	seq  atomic.Uint64
}

// New returns a Minter whose ids start with prefix (an instance's name,
// say; "" for none), which must hold only bytes valid in a request id.
func New(prefix string) *Minter {
	return &Minter{base: prefix + randomHex(6) + "-"}
}

// Next returns a new id.
func (m *Minter) Next() string {
	return m.base + strconv.FormatUint(m.seq.Add(1), 36)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand since Go 1.24)
	return hex.EncodeToString(b)
}

// ShortLen is the length of Short's hashed form; an id of fewer bytes is
// its own short form, so the two never meet.
const ShortLen = 11

// Short is the form in which a store keeps request id: the id itself when
// shorter than ShortLen, else ShortLen base64url characters of its 64-bit
// FNV-1a hash. Redis keeps the last admission's id in every token bucket,
// GCRA and window counter key, and the sliding window log keeps one per
// grant: nginx's 32 hex digits there cost each key a larger allocation.
// Two requests of one key whose ids share a hash would be taken for one
// (a resend, or one grant of the log): with 64 bits, never in practice;
// a client that picks its ids can repeat one anyway (see
// httplimit.Config.TrustedRequestIDs).
func Short(id string) string {
	if len(id) < ShortLen {
		return id
	}
	return shortname.Of(ShortLen, id)
}

// IsShort reports whether short is Short(id), without allocating: the
// resilient layer matches a request against a refusal's resend hint, which
// redisstore gives in short form, on the path of cached refusals.
func IsShort(id, short string) bool {
	if len(id) < ShortLen {
		return id == short
	}
	var b [ShortLen]byte
	return string(shortname.Append(b[:0], ShortLen, id)) == short
}
