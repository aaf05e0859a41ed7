// Package authrequest is the nginx auth_request door: a proxy in front of
// an upstream that is not this service (a static site, a service in
// another language) asks the check endpoint before proxying a request, and
// the answer applies the checks it is given (the policy file's, in the
// service) with the same middleware, identity rules, per-address ceiling
// and failure modes as the service's own routes. docs/DOORS.md has the nginx side; package envoyrls is the other door,
// Envoy's rate limit service.
package authrequest

import (
	"bytes"
	"context"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// The check endpoint and the headers of its protocol.
const (
	// Path is the check endpoint, on the public port. nginx routes
	// it only internally (auth_request); the service answers it only to a
	// trusted proxy.
	Path = "/_check"
	// HeaderOriginalURI and HeaderOriginalMethod carry the request being
	// checked ($request_uri, $request_method). The identity is read as on
	// the service's routes: X-API-Key (an auth_request subrequest carries
	// the client's headers), the client address from X-Real-IP.
	HeaderOriginalURI    = "X-Original-URI"
	HeaderOriginalMethod = "X-Original-Method"
	// HeaderCheckStatus and HeaderCheckProblem carry, on a refusal, the
	// status the client is to get (400, 401 or 429) and its problem body
	// (one line of JSON): auth_request knows only 2xx, 401 and 403, so a
	// 429 is answered 403 and a 400 or 401 is answered 401, and nginx
	// answers the client from these two headers.
	HeaderCheckStatus  = "X-RateLimit-Status"
	HeaderCheckProblem = "X-RateLimit-Problem"
)

// Check applies policies to the original URIs that match a chi pattern
// ("/static/*"): the policy file's checks.
type Check struct {
	Pattern  string
	Policies []ratelimit.Policy
}

// Handler answers the check endpoint for the proxies in trusted (anyone
// else gets 404): the original URI is matched against checks and decided
// by the middleware limits.
// Admitted: 204 with the rate-limit headers. Refused: 403 (a 429) or 401
// (a 400 or 401) with the headers, HeaderCheckStatus and HeaderCheckProblem.
// A URI no check matches, or no original URI at all, is a configuration
// error between the proxy and the policy file: 500, which auth_request
// turns into a 500 that the proxy's location handles as "limiter
// unreachable" (its documented failure mode). So is a middleware path that
// writes nothing: it decided nothing, and is never taken for an allow.
// misconfigured is told of each such 500 and why (to log it), or nil.
func Handler(checks []Check, limits *httplimit.Middleware, trusted []netip.Prefix, misconfigured func(r *http.Request, why string)) http.Handler {
	fail := func(w http.ResponseWriter, r *http.Request, why string) {
		if misconfigured != nil {
			misconfigured(r, why)
		}
		http.Error(w, why, http.StatusInternalServerError)
	}
	mux := chi.NewRouter()
	allow := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	for _, c := range checks {
		var h http.Handler = allow
		if len(c.Policies) > 0 {
			h = limits.Handler(c.Policies...)(allow)
		}
		mux.Handle(c.Pattern, h)
	}
	mux.NotFound(func(w http.ResponseWriter, r *http.Request) {
		fail(w, r, "no check of the policy file matches the original URI")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !trustedPeer(r, trusted) {
			http.NotFound(w, r)
			return
		}
		raw := r.Header.Get(HeaderOriginalURI)
		u, err := url.ParseRequestURI(raw)
		if raw == "" || err != nil {
			fail(w, r, "no usable "+HeaderOriginalURI+" header")
			return
		}
		orig := r.Clone(context.WithValue(r.Context(), chi.RouteCtxKey, nil)) // routed afresh by mux
		orig.URL = &url.URL{Path: cleanPath(u.Path), RawQuery: u.RawQuery}
		orig.RequestURI = raw
		if m := r.Header.Get(HeaderOriginalMethod); m != "" {
			orig.Method = m
		}
		rec := &checkRecorder{header: w.Header()}
		mux.ServeHTTP(rec, orig)
		if !rec.wroteHeader {
			// A path that answered nothing (the client went away before
			// the decision, say) decided nothing: never an allow.
			if r.Context().Err() == nil {
				fail(w, r, "the check answered nothing")
			} else {
				w.WriteHeader(http.StatusInternalServerError)
			}
			return
		}
		rec.answer(w)
	})
}

// cleanPath is p with its dot segments and repeated slashes resolved, as
// nginx resolves them before it picks a location, keeping a trailing slash.
func cleanPath(p string) string {
	c := path.Clean("/" + p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

// trustedPeer reports whether r comes from a proxy in trusted.
func trustedPeer(r *http.Request, trusted []netip.Prefix) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a := ap.Addr().Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// checkRecorder holds what the middleware answered for the original
// request, to be answered in auth_request's terms. Its zero status is no
// answer at all, which the check never takes for an allow.
type checkRecorder struct {
	header      http.Header // the real response's: the rate-limit headers go there as written
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (c *checkRecorder) Header() http.Header { return c.header }

func (c *checkRecorder) WriteHeader(code int) {
	if !c.wroteHeader {
		c.status, c.wroteHeader = code, true
	}
}

func (c *checkRecorder) Write(b []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	if c.body.Len() < 4<<10 {
		c.body.Write(b)
	}
	return len(b), nil
}

// answer writes the recorded answer in auth_request's terms.
func (c *checkRecorder) answer(w http.ResponseWriter) {
	h := w.Header()
	switch {
	case c.status >= 200 && c.status < 300:
		h.Del("Content-Type")
		h.Del("Content-Length")
		w.WriteHeader(http.StatusNoContent)
		return
	case c.status == http.StatusTooManyRequests, c.status == http.StatusBadRequest, c.status == http.StatusUnauthorized:
		h.Set(HeaderCheckStatus, strconv.Itoa(c.status))
		h.Set(HeaderCheckProblem, strings.TrimSpace(c.body.String()))
		h.Del("Content-Length")
		code := http.StatusUnauthorized
		if c.status == http.StatusTooManyRequests {
			code = http.StatusForbidden
		}
		w.WriteHeader(code)
		return
	}
	w.WriteHeader(c.status)
	_, _ = w.Write(c.body.Bytes())
}
