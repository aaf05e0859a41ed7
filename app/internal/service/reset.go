package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// resetRequest is the body of POST /admin/reset.
type resetRequest struct {
	// Key is the identity as the middleware counts it: "k:<API key id>"
	// or "ip:<client address>" (an IPv6 address or its /64).
	Key string `json:"key"`
	// Policy names the policy to reset; empty: every policy.
	Policy string `json:"policy"`
}

// resetResponse answers POST /admin/reset.
type resetResponse struct {
	Instance string   `json:"instance"`
	Key      string   `json:"key"`
	Policies []string `json:"policies"`
	// Scope is "fleet" (Redis dropped the identity's state and every
	// instance forgets what it holds of it within one heartbeat) or
	// "instance" (memory mode, or partial: this instance only).
	Scope   string `json:"scope"`
	Partial bool   `json:"partial,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// maxResetBody bounds the body of POST /admin/reset.
const maxResetBody = 4 << 10

// reset serves POST /admin/reset: it lifts one identity's limits under one
// policy, or every policy, fleet-wide. 200 when done (fleet-wide, or in
// memory mode on the only instance); 503 when Redis could not take it and
// it holds on this instance only (sending it again later completes it); a
// 400 problem for a body, key or policy it cannot use.
func (s *Server) reset(w http.ResponseWriter, r *http.Request) {
	var req resetRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxResetBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		s.badReset(w, r, "the body must be JSON: {\"key\": \"k:<API key id>\" or \"ip:<address>\", \"policy\": \"<name>\" (optional)}: "+err.Error())
		return
	}
	identity, err := resetIdentity(req.Key)
	if err != nil {
		s.badReset(w, r, err.Error())
		return
	}
	set := s.Policies()
	policies := set.Policies
	if req.Policy != "" {
		p, ok := set.Policy(req.Policy)
		if !ok {
			s.badReset(w, r, fmt.Sprintf("unknown policy %q", req.Policy))
			return
		}
		policies = []ratelimit.Policy{p}
	}
	names := make([]string, len(policies))
	for i, p := range policies {
		names[i] = p.Name
	}
	scope, err := s.backend.reset(r.Context(), identity, policies)
	if err != nil && !errors.Is(err, resilient.ErrResetPartial) {
		s.badReset(w, r, err.Error())
		return
	}
	out := resetResponse{Instance: s.cfg.Instance, Key: identity, Policies: names, Scope: scope}
	status, result := http.StatusOK, scope
	if err != nil {
		out.Scope = "instance"
		out.Partial, out.Detail = true, "applied on this instance only: "+strings.TrimPrefix(err.Error(), resilient.ErrResetPartial.Error()+": ")+"; send it again once Redis is back"
		status, result = http.StatusServiceUnavailable, "partial"
	}
	s.resets.WithLabelValues(result).Inc()
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "limits reset",
		slog.String("key", identity), slog.Any("policies", names), slog.String("scope", out.Scope), slog.Bool("partial", out.Partial))
	writeJSON(w, status, out)
}

// badReset answers a reset it cannot use with a 400 problem.
func (s *Server) badReset(w http.ResponseWriter, r *http.Request, detail string) {
	s.resets.WithLabelValues("invalid").Inc()
	badAdminRequest(w, r, detail)
}

// resetIdentity checks a reset's key and returns the identity the
// middleware counts it under: "k:" + a valid API key id, or "ip:" + an
// address (IPv6 grouped by /64, as httplimit.IPKey does; its /64 is
// accepted too).
func resetIdentity(key string) (string, error) {
	switch {
	case strings.HasPrefix(key, httplimit.APIKeyPrefix):
		if err := apikey.ValidID(key[len(httplimit.APIKeyPrefix):]); err != nil {
			return "", fmt.Errorf("key %q: %w", key, err)
		}
		return key, nil
	case strings.HasPrefix(key, httplimit.IPPrefix):
		v := key[len(httplimit.IPPrefix):]
		if a, err := netip.ParseAddr(v); err == nil && a.Zone() == "" {
			return httplimit.IPKey(a.Unmap()), nil
		}
		if p, err := netip.ParsePrefix(v); err == nil && p.Addr().Is6() && p.Bits() == 64 {
			return httplimit.IPKey(p.Addr()), nil
		}
		if v == "unknown" {
			return key, nil
		}
		return "", fmt.Errorf("key %q: not an address", key)
	}
	return "", errors.New("key must be an identity as counted: \"k:<API key id>\" or \"ip:<client address>\"")
}

// watchResets exports the resets: those asked on this instance's admin
// port, by result, and those the limiter applied (its own and, in Redis
// mode, those the fleet's reset log brought).
func (s *Server) watchResets() *prometheus.CounterVec {
	asked := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_admin_resets_total",
		Help: "POST /admin/reset calls on this instance by result: fleet (every instance hears of it), instance (memory mode), partial (Redis out: this instance only), invalid (400).",
	}, []string{"result"})
	s.metrics.reg.MustRegister(asked, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "ratelimit_resets_applied_total",
		Help: "Resets (one identity under one policy) the limiter applied: asked here, or read from the fleet's reset log.",
	}, func() float64 {
		if st := s.backend.status(); st.Limiter != nil {
			return float64(st.Limiter.ResetsApplied)
		}
		return 0
	}))
	return asked
}
