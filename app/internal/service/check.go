package service

// The nginx auth_request door: a proxy in front of an upstream that is not
// this service (a static site, a service in another language) asks the
// check endpoint before proxying a request, and the answer applies the
// policy file's checks with the same middleware, identity rules, per-address
// ceiling and failure modes as the service's own routes. docs/DOORS.md has
// the nginx side.

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// The check endpoint and the headers of its protocol.
const (
	// CheckPath is the check endpoint, on the public port. nginx routes
	// it only internally (auth_request); the service answers it only to a
	// trusted proxy.
	CheckPath = "/_check"
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

// checkHandler answers the check endpoint: the original URI is matched
// against the checks of set (the policies in force) and decided by the route middleware.
// Admitted: 204 with the rate-limit headers. Refused: 403 (a 429) or 401
// (a 400 or 401) with the headers, HeaderCheckStatus and HeaderCheckProblem.
// A URI no check matches, or no original URI at all, is a configuration
// error between the proxy and the policy file: 500, which auth_request
// turns into a 500 that the proxy's location handles as "limiter
// unreachable" (its documented failure mode). So is a middleware path that
// writes nothing: it decided nothing, and is never taken for an allow.
func (s *Server) checkHandler(set PolicySet, limits *httplimit.Middleware) http.Handler {
	mux := chi.NewRouter()
	allow := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	for _, c := range set.Checks {
		var h http.Handler = allow
		if len(c.Policies) > 0 {
			h = limits.Handler(c.Policies...)(allow)
		}
		mux.Handle(c.Pattern, h)
	}
	mux.NotFound(func(w http.ResponseWriter, r *http.Request) {
		s.checkMisconfigured(w, r, "no check of the policy file matches the original URI")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.trustedPeer(r) {
			http.NotFound(w, r)
			return
		}
		raw := r.Header.Get(HeaderOriginalURI)
		u, err := url.ParseRequestURI(raw)
		if raw == "" || err != nil {
			s.checkMisconfigured(w, r, "no usable "+HeaderOriginalURI+" header")
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
				s.checkMisconfigured(w, r, "the check answered nothing")
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

// trustedPeer reports whether r comes from a trusted proxy.
func (s *Server) trustedPeer(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a := ap.Addr().Unmap()
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// checkMisconfigured answers 500 and logs, at most once a second.
func (s *Server) checkMisconfigured(w http.ResponseWriter, r *http.Request, why string) {
	now := time.Now().UnixNano()
	if last := s.errLoggedAt.Load(); now-last >= int64(time.Second) && s.errLoggedAt.CompareAndSwap(last, now) {
		id, _ := httplimit.RequestIDFromContext(r.Context())
		s.log.LogAttrs(r.Context(), slog.LevelError, "check endpoint misconfigured", slog.String("request_id", id),
			slog.String("reason", why), slog.String("original_uri", truncate(r.Header.Get(HeaderOriginalURI), 200)))
	}
	http.Error(w, why, http.StatusInternalServerError)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
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
