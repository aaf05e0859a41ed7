// The request id a decision is made with: the request's context's, a
// trusted proxy's X-Request-Id, or a new one.

package httplimit

import (
	"context"
	"net/http"
)

// RequestID returns the id the middleware uses for r: the one in r's
// context, else X-Request-Id from a trusted proxy (with
// Config.TrustedRequestIDs), else a new random one. A service can call it in
// an outer middleware, store the id with ContextWithRequestID and log with
// it.
func (m *Middleware) RequestID(r *http.Request) string {
	id, _ := m.requestIDOf(r, m.isTrusted(peerAddr(r)))
	return id
}

// requestIDOf returns the request's id and whether it came from the context.
func (m *Middleware) requestIDOf(r *http.Request, peerTrusted bool) (string, bool) {
	if id, ok := RequestIDFromContext(r.Context()); ok {
		return id, true
	}
	if peerTrusted && m.trustIDs {
		if id := getHeader(r.Header, keyRequestID); ValidRequestID(id) {
			return id, false
		}
	}
	return NewRequestID(), false
}

type requestIDKey struct{}

// ContextWithRequestID returns ctx carrying a request id, which the
// middleware then uses as is.
func ContextWithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestIDFromContext returns the request id stored in ctx.
func RequestIDFromContext(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(requestIDKey{}).(string)
	return id, ok && id != ""
}
