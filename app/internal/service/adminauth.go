// The admin port's guard: a bearer token on every /admin/* and /debug/*
// request (RL_ADMIN_TOKEN). /healthz, /readyz, /metrics and /status stay
// open to probes and scrapers.

package service

import (
	"crypto/subtle"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// minAdminToken is the shortest admin token accepted, in bytes.
const minAdminToken = 32

// ProblemAdminUnauthorized is the problem type of a refused admin request.
const ProblemAdminUnauthorized = "https://github.com/fleetlimit/fleetlimit/blob/main/docs/problems.md#admin-unauthorized"

// problemInvalidRequest is the type of a 400 problem, the middleware's own.
const problemInvalidRequest = "https://github.com/fleetlimit/fleetlimit/blob/main/docs/problems.md#invalid-request"

// validateAdminTokens checks RL_ADMIN_TOKEN: every token at least
// minAdminToken bytes, and one at least unless the admin address is
// loopback or the instance runs in demo mode.
func (c *Config) validateAdminTokens() error {
	for i, t := range c.AdminTokens {
		if len(t) < minAdminToken {
			return configErr("RL_ADMIN_TOKEN", "token %d is %d bytes, want at least %d (openssl rand -base64 32)", i+1, len(t), minAdminToken)
		}
	}
	if len(c.AdminTokens) == 0 && !c.Demo && !loopbackAddr(c.AdminAddr) {
		return configErr("RL_ADMIN_TOKEN", "required: RL_ADMIN_ADDR %s is not a loopback address, and without a token anyone who reaches it can reset any client's limits", c.AdminAddr)
	}
	return nil
}

// loopbackAddr reports whether addr (host:port) listens on loopback only.
// An empty host (":9090") is every interface.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// adminGuard answers 401 to a request under /admin/ or /debug/ without one
// of tokens as its bearer token, and passes every other request to next.
// With no token it passes everything (the start allows that only on
// loopback or in demo mode). Tokens are compared in constant time, each of
// them every time.
func (s *Server) adminGuard(tokens []string, next http.Handler) http.Handler {
	if len(tokens) == 0 {
		return next
	}
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_admin_unauthorized_total",
		Help: "Admin requests (/admin/*, /debug/*) refused with 401: no bearer token, or not one of RL_ADMIN_TOKEN.",
	})
	s.metrics.reg.MustRegister(refused)
	want := make([][]byte, len(tokens))
	for i, t := range tokens {
		want[i] = []byte(t)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/admin/") && !strings.HasPrefix(r.URL.Path, "/debug/") {
			next.ServeHTTP(w, r)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		match := 0
		for _, t := range want {
			match |= subtle.ConstantTimeCompare([]byte(got), t)
		}
		if ok && match == 1 {
			next.ServeHTTP(w, r)
			return
		}
		refused.Inc()
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "admin request refused: no valid bearer token",
			slog.String("path", r.URL.Path), slog.String("remote", r.RemoteAddr), slog.Bool("token_sent", ok && got != ""))
		w.Header().Set("WWW-Authenticate", `Bearer realm="fleetlimit-admin"`)
		writeAdminProblem(w, httplimit.Problem{Type: ProblemAdminUnauthorized, Title: "Unauthorized",
			Status: http.StatusUnauthorized, Detail: "admin endpoints need Authorization: Bearer <RL_ADMIN_TOKEN>", Instance: r.URL.Path})
	})
}

// badAdminRequest answers an admin request it cannot use (a bad key,
// policy or parameter) with a 400 problem.
func badAdminRequest(w http.ResponseWriter, r *http.Request, detail string) {
	writeAdminProblem(w, httplimit.Problem{Type: problemInvalidRequest, Title: "Bad Request",
		Status: http.StatusBadRequest, Detail: detail, Instance: r.URL.Path})
}

// writeAdminProblem writes p as an RFC 9457 body with p.Status.
func writeAdminProblem(w http.ResponseWriter, p httplimit.Problem) {
	body, _ := json.Marshal(p)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}
