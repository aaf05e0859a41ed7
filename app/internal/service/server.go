// Package service is the rate-limiter service: configuration from the
// environment, the policy file, the public router (chi) whose /api/ routes
// are wrapped by httplimit, and the per-instance admin server (/healthz,
// /readyz, /metrics, /status). cmd/ratelimiter only wires it to the process.
package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/fleetlimit/app/internal/authrequest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// ShutdownTimeout bounds the drain of in-flight requests at shutdown;
// closing the limiter then has closeTimeout more. Together they stay below
// Docker's default 10 s stop grace period.
const ShutdownTimeout = 7 * time.Second

const closeTimeout = 2 * time.Second

// Server is a running service. Start returns it; Wait blocks until it has
// shut down.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	backend *backend
	limiter ratelimit.Limiter // the backend's, instrumented (and traced: tracing.go): what every door decides with
	rls     *rlsDoor          // nil: RL_GRPC_ADDR is empty
	tracing *tracing          // nil: off (tracing.go)
	started time.Time
	resets  *prometheus.CounterVec // POST /admin/reset by result (reset.go)

	// policy is the policy set in force and its router (reload.go).
	policy    atomic.Pointer[policyState]
	reloads   policyReloads
	stopWatch context.CancelFunc // stops the policy file watcher (nil: none)
	watchDone chan struct{}      // closed when it has stopped

	public, admin     *http.Server
	publicLn, adminLn net.Listener

	clock       wallClock
	ready       atomic.Bool
	errLoggedAt atomic.Int64 // unix ns of the last limiter-error log line
	uncounted   atomic.Uint64

	serveErr chan error // unexpected Serve errors (public, admin, gRPC)
	done     chan struct{}
	waitErr  error
}

// Run starts the service and blocks until ctx is cancelled and the service
// has drained and shut down. Configuration problems are returned as a
// *ConfigError before anything starts. Logs go to stdout as JSON; stderr
// receives net/http's own unstructured error lines.
func Run(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) error {
	s, err := Start(ctx, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	return s.Wait()
}

// Start reads the configuration, builds the limiter, binds both ports and
// serves in the background until ctx is cancelled. With port 0 in
// RL_LISTEN_ADDR / RL_ADMIN_ADDR, PublicAddr and AdminAddr tell where it
// listens.
func Start(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) (*Server, error) {
	cfg, err := LoadConfig(getenv)
	if err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: cfg.LogLevel})).
		With(slog.String("instance", cfg.Instance))
	s := &Server{
		cfg:      cfg,
		log:      logger,
		metrics:  newMetrics(),
		started:  time.Now(),
		serveErr: make(chan error, 3),
		done:     make(chan struct{}),
	}
	if cfg.DebugClock {
		logger.Warn("RL_DEBUG_CLOCK is on: POST /debug/clock on the admin port moves this instance's wall clock (chaos stacks only)")
	}
	if s.tracing, err = newTracing(getenv, cfg.Instance, logger); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil { // every failed return below has set err
			_ = s.tracing.shutdown(context.Background())
		}
	}()
	if s.backend, err = newBackend(cfg, s.metrics, logger, s.clock.Now, s.tracing); err != nil {
		return nil, err
	}
	s.metrics.watchStatus(s.backend.status)
	s.startGuards()
	s.metrics.reg.MustRegister(&recoveryCollector{status: s.backend.status})

	if cfg.APIKeys == nil {
		logger.Warn("RL_API_KEY_SECRET is not set: every X-API-Key is refused (401), clients are limited per address")
	}
	s.limiter = s.tracing.limiter(s.metrics.instrument(s.backend.limiter))
	s.policy.Store(s.newPolicyState(cfg.Policies, s.started))
	s.metrics.reg.MustRegister(policyCollector{s})

	errorLog := log.New(stderr, "", log.LstdFlags)
	s.public = &http.Server{
		Handler:           s.tracing.handler(http.HandlerFunc(s.servePublic)),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          errorLog,
	}
	s.admin = &http.Server{
		Handler:           s.adminRouter(),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          errorLog,
	}
	if s.publicLn, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
		_ = s.backend.close(ctx)
		return nil, fmt.Errorf("listen on RL_LISTEN_ADDR %s: %w", cfg.ListenAddr, err)
	}
	if s.adminLn, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
		_ = s.publicLn.Close()
		_ = s.backend.close(ctx)
		return nil, fmt.Errorf("listen on RL_ADMIN_ADDR %s: %w", cfg.AdminAddr, err)
	}
	if s.rls, err = s.startRLS(); err != nil {
		_ = s.publicLn.Close()
		_ = s.adminLn.Close()
		_ = s.backend.close(ctx)
		return nil, err
	}
	go s.serve(s.public, s.publicLn)
	go s.serve(s.admin, s.adminLn)
	s.ready.Store(true)
	logger.Info("serving",
		slog.String("public_addr", s.PublicAddr()), slog.String("admin_addr", s.AdminAddr()),
		slog.Int("routes", len(cfg.Policies.Routes)), slog.String("policy_version", cfg.Policies.Version),
		slog.Bool("debug_headers", cfg.DebugHeaders))
	if cfg.PolicyFile != "" || s.rls != nil {
		var watchCtx context.Context
		watchCtx, s.stopWatch = context.WithCancel(ctx)
		s.watchDone = make(chan struct{})
		go s.watchPolicyFile(watchCtx, cfg.HeartbeatInterval, s.watchDone)
	}
	go s.shutdownOn(ctx)
	return s, nil
}

// PublicAddr is the address the public server listens on.
func (s *Server) PublicAddr() string { return s.publicLn.Addr().String() }

// AdminAddr is the address the admin server listens on.
func (s *Server) AdminAddr() string { return s.adminLn.Addr().String() }

// Wait blocks until the server has shut down (after the context given to
// Start is cancelled, or a server failed) and returns the first error.
func (s *Server) Wait() error {
	<-s.done
	return s.waitErr
}

func (s *Server) serve(srv *http.Server, ln net.Listener) {
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.serveErr <- err
	}
}

// shutdownOn waits for ctx (or a failed server), then turns /readyz to 503,
// stops accepting and drains in-flight public requests for up to
// ShutdownTimeout, stops the admin server and closes the limiter.
func (s *Server) shutdownOn(ctx context.Context) {
	var failure error
	select {
	case <-ctx.Done():
	case failure = <-s.serveErr:
		s.log.Error("server failed", slog.String("error", failure.Error()))
	}
	s.ready.Store(false)
	s.log.Info("shutting down", slog.Duration("drain_timeout", ShutdownTimeout))
	drain, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := s.public.Shutdown(drain); err != nil {
		s.log.Warn("drain incomplete; closing connections", slog.String("error", err.Error()))
		_ = s.public.Close()
	}
	s.rls.stop(drain)
	if err := s.admin.Shutdown(drain); err != nil {
		_ = s.admin.Close()
	}
	if s.stopWatch != nil {
		s.stopWatch()
		<-s.watchDone
	}
	closing, cancelClose := context.WithTimeout(context.Background(), closeTimeout)
	defer cancelClose()
	var flushed sync.WaitGroup // the spans still queued, beside the limiter's close
	flushed.Go(func() {
		if err := s.tracing.shutdown(closing); err != nil {
			s.log.Warn("flushing the traces", slog.String("error", err.Error()))
		}
	})
	if err := s.backend.close(closing); err != nil {
		s.log.Warn("closing the limiter", slog.String("error", err.Error()))
	}
	flushed.Wait()
	if failure != nil {
		s.waitErr = failure
	}
	s.log.Info("stopped")
	close(s.done)
}

// limiterError is the middleware's ErrorHandler: fail open (see httplimit),
// logging at most one line per second so an outage does not flood the log.
// The metrics count every error.
func (s *Server) limiterError(_ http.ResponseWriter, r *http.Request, p ratelimit.Policy, err error) bool {
	now := time.Now().UnixNano()
	if last := s.errLoggedAt.Load(); now-last >= int64(time.Second) && s.errLoggedAt.CompareAndSwap(last, now) {
		id, _ := httplimit.RequestIDFromContext(r.Context())
		s.log.LogAttrs(r.Context(), slog.LevelError, "rate limiter failed; failing open",
			slog.String("request_id", id), slog.String("policy", p.Name), slog.String("error", err.Error()))
	}
	return true
}

// publicRouter mounts every route of set, each behind its policies, on a
// demo handler.
func (s *Server) publicRouter(set PolicySet, limits *httplimit.Middleware) http.Handler {
	r := chi.NewRouter()
	r.Use(s.requestLog(limits))
	r.Handle(authrequest.Path, s.checkHandler(set, limits))
	for _, route := range set.Routes {
		h := s.demoHandler(route)
		if len(route.Policies) > 0 {
			h = limits.Handler(route.Policies...)(h)
		}
		r.Handle(route.Pattern, h)
	}
	return r
}

// demoHandler answers {"instance", "route", "policy", "policies"}: policy
// is the route's own policy (the first, the one RateLimit-Policy lists
// first; "" on a route without limits), policies every policy the route
// applies, the per-address ceiling included.
func (s *Server) demoHandler(route Route) http.Handler {
	names := make([]string, len(route.Policies))
	for i, p := range route.Policies {
		names[i] = p.Name
	}
	own := "" // a route served without limits
	if len(names) > 0 {
		own = names[0]
	}
	body, _ := json.Marshal(struct {
		Instance string   `json:"instance"`
		Route    string   `json:"route"`
		Policy   string   `json:"policy"`
		Policies []string `json:"policies"`
	}{s.cfg.Instance, route.Pattern, own, names})
	body = append(body, '\n')
	length := strconv.Itoa(len(body))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if counted, ok := httplimit.Counted(r.Context()); ok && !counted {
			s.uncounted.Add(1)
			s.metrics.uncounted.Inc()
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", length)
		_, _ = w.Write(body)
	})
}

// requestLog sets the request id (nginx's X-Request-Id from a trusted
// proxy with RL_TRUST_REQUEST_ID, else a new one) for the whole request, echoes it, counts it, and
// logs it at debug (a 5xx at warn).
func (s *Server) requestLog(limits *httplimit.Middleware) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler { return s.logRequests(limits, next) }
}

func (s *Server) logRequests(limits *httplimit.Middleware, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := limits.RequestID(r)
		r = r.WithContext(httplimit.ContextWithRequestID(r.Context(), id))
		w.Header().Set("X-Request-Id", id)
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		if !sw.wroteHeader && r.Context().Err() != nil {
			// The client went away before anything was answered (the
			// limiter ran no handler: httplimit): nginx's 499.
			sw.status = statusClientClosed
		}
		route := "unmatched"
		if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
			route = rc.RoutePattern()
		}
		s.metrics.requests.WithLabelValues(route, strconv.Itoa(sw.status)).Inc()
		s.tracing.nameSpan(r, route)
		// nginx's access log has every request (with this id); here a
		// line per request only at debug, and always for a 5xx. At info,
		// a line per request doubled the CPU the compose stack spent on
		// logging (docs/MEASURING.md).
		level := slog.LevelDebug
		if sw.status >= 500 {
			level = slog.LevelWarn
		}
		if !s.log.Enabled(r.Context(), level) {
			return
		}
		s.log.LogAttrs(r.Context(), level, "request",
			slog.String("request_id", id),
			slog.String("method", r.Method),
			slog.String("route", route),
			slog.Int("status", sw.status),
			slog.String("mode", sw.Header().Get("X-RateLimit-Mode")),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
	})
}

// statusClientClosed is nginx's code for a request whose client closed the
// connection before it was answered.
const statusClientClosed = 499

// statusWriter records the status code.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// checkAPIKey checks a signed API key (package apikey) and returns its id,
// the identity its requests count under. Without RL_API_KEY_SECRET no key
// is valid.
func (s *Server) checkAPIKey(_ context.Context, key string) (string, error) {
	if s.cfg.APIKeys == nil {
		return "", errors.New("no API keys are configured (RL_API_KEY_SECRET)")
	}
	return s.cfg.APIKeys.Check(key)
}
