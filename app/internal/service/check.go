package service

// The nginx auth_request door (package authrequest) on the public port,
// with the policy file's checks.

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/fleetlimit/fleetlimit/app/internal/authrequest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// checkHandler answers authrequest.Path with the checks of set (the
// policies in force), for the trusted proxies.
func (s *Server) checkHandler(set PolicySet, limits *httplimit.Middleware) http.Handler {
	checks := make([]authrequest.Check, len(set.Checks))
	for i, c := range set.Checks {
		checks[i] = authrequest.Check{Pattern: c.Pattern, Policies: c.Policies}
	}
	return authrequest.Handler(checks, limits, s.cfg.TrustedProxies, s.checkMisconfigured)
}

// checkMisconfigured logs a check answered 500 (a proxy and a policy file
// that do not agree), at most once a second.
func (s *Server) checkMisconfigured(r *http.Request, why string) {
	now := time.Now().UnixNano()
	if last := s.errLoggedAt.Load(); now-last >= int64(time.Second) && s.errLoggedAt.CompareAndSwap(last, now) {
		id, _ := httplimit.RequestIDFromContext(r.Context())
		s.log.LogAttrs(r.Context(), slog.LevelError, "check endpoint misconfigured", slog.String("request_id", id),
			slog.String("reason", why), slog.String("original_uri", truncate(r.Header.Get(authrequest.HeaderOriginalURI), 200)))
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
