package service

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/lease"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// Status is the body of /status.
type Status struct {
	Instance string `json:"instance"`
	// Mode is what decides right now: memory, redis, or (with the resilient
	// limiter) local.
	Mode string `json:"mode"`
	// Breaker is the circuit breaker's state; "" until the resilient
	// limiter reports one.
	Breaker string `json:"breaker"`
	// LiveInstances is the fleet size the fallback divides by; 0 while
	// unknown.
	LiveInstances     int `json:"live_instances"`
	ExpectedInstances int `json:"expected_instances"`
	// JournalSize counts local grants not yet reconciled with Redis.
	JournalSize int64 `json:"journal_size"`
	// LastReconciliation is when the journal was last replayed; null:
	// never.
	LastReconciliation *time.Time `json:"last_reconciliation"`
	// RedisTimeoutMS is RL_REDIS_TIMEOUT (absent in memory mode): a
	// decision never waits longer for Redis.
	RedisTimeoutMS int64     `json:"redis_timeout_ms,omitempty"`
	Ready          bool      `json:"ready"`
	StartedAt      time.Time `json:"started_at"`
	// UncountedRequests counts the requests whose handler ran without a
	// counted decision (a policy failed open).
	UncountedRequests uint64 `json:"uncounted_requests"`
	// DemoMode is RL_DEMO: the published demo API-key secret is accepted.
	DemoMode bool `json:"demo_mode"`
	// Limiter is the resilient limiter's own status: breaker openings,
	// fleet view, and the journal's reconciliation (granted locally =
	// replayed + present + dropped + duplicate units + pending).
	Limiter *resilient.Status `json:"limiter,omitempty"`
	// Lease is what lease mode did (absent in memory mode).
	Lease *lease.Stats `json:"lease,omitempty"`
	PolicyStatus
}

// adminRouter serves the per-instance admin endpoints (not routed by nginx).
func (s *Server) adminRouter() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{Registry: s.metrics.reg}))
	mux.HandleFunc("GET /status", s.status)
	mux.HandleFunc("POST /admin/reset", s.reset)
	mux.HandleFunc("GET /admin/top", s.top)
	mux.HandleFunc("GET /admin/keys", s.keys)
	if s.cfg.DebugClock {
		mux.HandleFunc("/debug/clock", s.clock.serve)
	}
	if s.cfg.Pprof {
		// The Go profiler, for finding where an instance's CPU goes (a
		// replay, a load test), only with RL_PPROF=true (TestPprofOnlyWhenAsked):
		// go tool pprof http://<admin>/debug/pprof/profile?seconds=5
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	}
	return s.adminGuard(s.cfg.AdminTokens, mux)
}

// readyz is 200 while the instance can serve, which includes a Redis outage
// (the fallback, or in the interim fail-open, serves), and 503 once shutdown
// has begun.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if !s.ready.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "shutting down"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (s *Server) status(w http.ResponseWriter, _ *http.Request) {
	out := s.backend.status()
	out.Instance = s.cfg.Instance
	out.ExpectedInstances = s.cfg.ExpectedInstances
	out.Ready = s.ready.Load()
	out.RedisTimeoutMS = redisTimeoutMS(s.cfg)
	out.StartedAt = s.started.UTC().Truncate(time.Second)
	out.UncountedRequests = s.uncounted.Load()
	out.DemoMode = s.cfg.Demo
	out.PolicyStatus = s.policyStatus()
	writeJSON(w, http.StatusOK, out)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

func redisTimeoutMS(c Config) int64 {
	if !c.RedisEnabled() {
		return 0
	}
	return c.RedisTimeout.Milliseconds()
}
