package service

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/fleetlimit/fleetlimit/app/internal/envoyrls"
)

// rlsDoor serves Envoy's rate limit service v3 (package envoyrls) on
// RL_GRPC_ADDR, deciding through the same instrumented limiter as the HTTP
// routes, with the gRPC health service (for Envoy's and nginx's checks)
// and server reflection (for grpcurl); over TLS or mTLS with
// RL_GRPC_TLS* (rlstls.go).
type rlsDoor struct {
	srv     *grpc.Server
	ln      net.Listener
	health  *health.Server
	svc     *envoyrls.Service
	reloads rlsReloads // of RL_RLS_CONFIG_DIR (rlsreload.go)
}

// startRLS listens on cfg.GRPCAddr and serves in the background; nil when
// RL_GRPC_ADDR is empty.
func (s *Server) startRLS() (*rlsDoor, error) {
	if s.cfg.GRPCAddr == "" {
		return nil, nil
	}
	opts := []envoyrls.Option{envoyrls.WithTrustedProxies(s.cfg.TrustedProxies), envoyrls.WithLogger(s.log)}
	if s.cfg.TrustRequestID {
		// As on the HTTP routes: a trusted proxy's request id only when
		// it is known to overwrite the client's (RL_TRUST_REQUEST_ID).
		opts = append(opts, envoyrls.WithTrustedRequestIDs())
	}
	if s.cfg.RLSResponseHeaders {
		opts = append(opts, envoyrls.WithResponseHeaders())
	}
	if s.cfg.DebugHeaders {
		opts = append(opts, envoyrls.WithDebug(s.cfg.Instance))
	}
	opts = append(opts, envoyrls.WithStats(newRLSHits(s.metrics.reg).record)) // rlsmetrics.go
	svc := envoyrls.New(s.limiter, s.cfg.RLS, opts...)
	ln, err := net.Listen("tcp", s.cfg.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on RL_GRPC_ADDR %s: %w", s.cfg.GRPCAddr, err)
	}
	srvOpts := s.tracing.grpcServerOptions() // none when tracing is off
	tlsCfg := s.cfg.GRPCTLSConfig
	if tlsCfg != nil {
		srvOpts = append(srvOpts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	d := &rlsDoor{srv: grpc.NewServer(srvOpts...), ln: ln, health: health.NewServer(), svc: svc}
	d.reloads.stamp = envoyrls.Stamp(s.cfg.RLSConfigDir)
	d.reloads.loadedAt.Store(s.started.UnixNano())
	s.metrics.reg.MustRegister(rlsCollector{d})
	svc.Register(d.srv)
	healthpb.RegisterHealthServer(d.srv, d.health)
	reflection.Register(d.srv)
	go func() {
		if err := d.srv.Serve(ln); err != nil {
			s.serveErr <- err
		}
	}()
	s.log.Info("serving Envoy's rate limit service", slog.String("grpc_addr", ln.Addr().String()),
		slog.Any("domains", s.cfg.RLS.Domains()), slog.Any("files", s.cfg.RLS.Files()), slog.String("rls_config_version", s.cfg.RLS.Version()),
		slog.Bool("response_headers", s.cfg.RLSResponseHeaders), slog.Bool("tls", tlsCfg != nil),
		slog.Bool("mtls", tlsCfg != nil && tlsCfg.ClientAuth == tls.RequireAndVerifyClientCert))
	return d, nil
}

// stop reports not serving, then lets the calls in progress finish until
// ctx ends and stops.
func (d *rlsDoor) stop(ctx context.Context) {
	if d == nil {
		return
	}
	d.health.Shutdown()
	done := make(chan struct{})
	go func() {
		d.srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		d.srv.Stop()
		<-done
	}
}

// GRPCAddr is the address the rate limit service listens on ("" when it is
// not served).
func (s *Server) GRPCAddr() string {
	if s.rls == nil {
		return ""
	}
	return s.rls.ln.Addr().String()
}
