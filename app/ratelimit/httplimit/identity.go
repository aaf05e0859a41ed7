package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/reqid"
)

// identities returns the default identities of r: key, under which the
// route's policies count ("k:" + the API key's identity when X-API-Key is
// present, else the address identity), and addr ("ip:" + the client
// address), under which the per-address policies count. An error wrapping
// ErrInvalidAPIKey means the key was refused (addr is still set); any other
// error means the header is unusable.
func (m *Middleware) identities(r *http.Request, peer netip.Addr, peerTrusted bool) (key, addr string, err error) {
	client := peer
	if peerTrusted {
		client = forwardedClient(r, peer, m.trusted)
	}
	addr = IPKey(client)
	vals := r.Header[keyAPIKey]
	if len(vals) == 0 {
		return addr, addr, nil
	}
	if len(vals) > 1 {
		return "", addr, fmt.Errorf("%w: more than one X-API-Key header", ratelimit.ErrInvalidRequest)
	}
	raw := vals[0]
	if raw == "" || contract.ValidateKey(APIKeyPrefix+raw) != nil {
		return "", addr, fmt.Errorf("%w: X-API-Key must be 1 to %d bytes without control characters",
			ratelimit.ErrInvalidRequest, ratelimit.MaxKeyBytes-len(APIKeyPrefix))
	}
	if m.check == nil {
		return APIKeyPrefix + raw, addr, nil
	}
	id, err := m.check(r.Context(), raw)
	if err != nil {
		return "", addr, fmt.Errorf("%w: %w", ErrInvalidAPIKey, err)
	}
	if id == "" || contract.ValidateKey(APIKeyPrefix+id) != nil {
		return "", addr, fmt.Errorf("%w: the key check returned an unusable identity", ErrInvalidAPIKey)
	}
	return APIKeyPrefix + id, addr, nil
}

// ClientIP returns the address of the client that sent r: the direct peer
// (RemoteAddr), unless the peer is in trusted; then the address a trusted
// proxy reported: X-Real-IP when it holds an untrusted address, else the
// rightmost untrusted hop of X-Forwarded-For (every hop to its right was
// appended by a trusted proxy, so the client cannot forge it; hops to its
// left are the client's word and are ignored). When every hop is trusted the
// leftmost one is used. Addresses are unmapped (::ffff:1.2.3.4 is 1.2.3.4)
// and lose their zone. The zero Addr means RemoteAddr was not an address
// (a Unix socket, say).
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := peerAddr(r)
	if !contains(trusted, peer) {
		return peer
	}
	return forwardedClient(r, peer, trusted)
}

// IPKey returns the identity of a client address: "ip:" + the address for
// IPv4, "ip:" + its /64 network for IPv6 (one subscriber usually holds a
// whole /64), and "ip:unknown" for the zero Addr.
func IPKey(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return IPPrefix + "unknown"
	case a.Is6():
		p, _ := a.Prefix(64)
		return IPPrefix + p.String()
	}
	return IPPrefix + a.String()
}

// forwardedClient is ClientIP for a trusted peer.
func forwardedClient(r *http.Request, peer netip.Addr, trusted []netip.Prefix) netip.Addr {
	client := peer
	if v := getHeader(r.Header, keyRealIP); v != "" {
		if a, ok := parseHop(v); ok {
			if !contains(trusted, a) {
				return a
			}
			client = a
		}
	}
	vals := r.Header[keyForwardedFor]
	for i := len(vals) - 1; i >= 0; i-- {
		v := vals[i]
		for v != "" {
			hop := v
			if j := strings.LastIndexByte(v, ','); j >= 0 {
				hop, v = v[j+1:], v[:j]
			} else {
				v = ""
			}
			hop = strings.TrimSpace(hop)
			if hop == "" {
				continue
			}
			a, ok := parseHop(hop)
			if !ok {
				// A trusted proxy writes well-formed hops, so this one is the
				// client's: stop at the last hop a trusted proxy vouched for.
				return client
			}
			if !contains(trusted, a) {
				return a
			}
			client = a
		}
	}
	return client
}

// parseHop parses one X-Forwarded-For or X-Real-IP entry: an address,
// optionally with a port ("1.2.3.4:5", "[::1]:5").
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return normalize(a), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), true
	}
	return netip.Addr{}, false
}

// peerAddr is the direct peer's address, or the zero Addr.
func peerAddr(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return normalize(ap.Addr())
	}
	if a, err := netip.ParseAddr(r.RemoteAddr); err == nil {
		return normalize(a)
	}
	return netip.Addr{}
}

func normalize(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

func (m *Middleware) isTrusted(a netip.Addr) bool { return contains(m.trusted, a) }

func contains(prefixes []netip.Prefix, a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// NewRequestID returns a new request id, as the middleware gives a request
// that comes without one: 32 random hex digits, the shape of nginx's
// $request_id. Other front doors (the gRPC rate limit service) mint theirs
// with it, so that every id the fleet sees has one source.
func NewRequestID() string { return reqid.Random() }

// ValidRequestID reports whether id is usable as a request id: 1 to 128
// bytes of [A-Za-z0-9._:-] (nginx's $request_id is 32 hex digits; UUIDs
// pass too). The middleware replaces any other id with a generated one.
func ValidRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDBytes {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}
