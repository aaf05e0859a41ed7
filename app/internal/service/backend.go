package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/lease"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// backend is the limiter the service decides with, how it reports its
// status, and how to release it.
type backend struct {
	limiter ratelimit.Limiter
	// status fills in what the limiter layer knows of /status: Mode,
	// Breaker, LiveInstances, JournalSize, LastReconciliation and Limiter.
	status func() Status
	// close releases the limiter at shutdown, within ctx's deadline.
	close func(ctx context.Context) error
	// reset lifts identity's limits under policies (POST /admin/reset): for
	// the fleet ("fleet"), or in memory mode for this instance, which is all
	// there is ("instance"). An error wrapping resilient.ErrResetPartial:
	// it holds on this instance only; any other error is a bad request
	// (nothing was reset).
	reset func(ctx context.Context, identity string, policies []ratelimit.Policy) (scope string, err error)
	// inspect reads identity's state under policies, counting nothing
	// (GET /admin/keys, keys.go).
	inspect func(ctx context.Context, identity string, policies []ratelimit.Policy) []keyPolicy
}

// newBackend is the one place that picks the limiter implementation.
//
// No Redis configured: the in-memory store (mode "memory"). Redis
// configured: the Redis store wrapped in the resilient limiter (circuit
// breaker, fallback budget, journal and replay). An unreachable Redis does
// not stop the start: the fallback serves. With TLS to Redis, each
// configured address gets one handshake first (checkRedisTLS), so that a
// wrong CA or an expired certificate stops the start with a *ConfigError
// naming the setting instead of passing for an outage. A Redis older than
// 7.0 (no functions) stops the start the same way (checkRedisVersion); one
// that does not answer is let through. With tracing on
// (tr not nil), the Redis clients and the recoveries make spans.
func newBackend(cfg Config, m *metrics, log *slog.Logger, now func() time.Time, tr *tracing) (*backend, error) {
	if !cfg.RedisEnabled() {
		mem := memstore.New(memstore.Config{Capacity: cfg.KeyCapacity})
		m.watchLocal(mem.Stats)
		log.Info("limiter ready", slog.String("mode", string(ratelimit.ModeMemory)), slog.Int("key_capacity", cfg.KeyCapacity))
		return &backend{
			limiter: mem,
			status:  func() Status { return Status{Mode: string(ratelimit.ModeMemory), LiveInstances: 1} },
			close:   func(context.Context) error { return nil },
			reset: func(ctx context.Context, identity string, policies []ratelimit.Policy) (string, error) {
				return "instance", mem.Reset(ctx, identity, policies...)
			},
			inspect: inspectMemory(mem),
		}, nil
	}
	if cfg.RedisTLSConfig != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*max(cfg.RedisTimeout, redisTLSCheckMin))
		err := checkRedisTLS(ctx, cfg, log)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	// go-redis logs through one process-wide logger: this instance's slog
	// (with several servers in one process, the last one started).
	redis.SetLogger(newRedisLogger(log, time.Second, time.Now))
	cc := redisstore.ClientConfig{
		URL:        cfg.RedisURL,
		Addrs:      cfg.RedisAddrs,
		MasterName: cfg.RedisMasterName,
		Username:   cfg.RedisUsername,
		Password:   cfg.RedisPassword,
		Timeout:    cfg.RedisTimeout,
		PoolSize:   cfg.RedisPoolSize,
		TLS:        cfg.RedisTLSConfig,
		// A reply is read until the limiter's late window ends.
		LateReplies: cfg.LateWindow,
	}
	client, err := redisstore.NewClient(cc)
	if err != nil {
		return nil, fmt.Errorf("redis client: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*max(cfg.RedisTimeout, redisTLSCheckMin))
	err = checkRedisVersion(ctx, cfg, client, log)
	cancel()
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	// Replays and restores on a client of their own: go-redis cuts every
	// socket read at the client's read timeout, whatever the context says.
	cc.Timeout, cc.PoolSize, cc.LateReplies = cfg.ReplayTimeout, 2, 0
	replayClient, err := redisstore.NewClient(cc)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("redis client: %w", err)
	}
	// The replays' calls carry no request's span: each is a trace.
	if err := errors.Join(tr.instrumentRedis(client, true), tr.instrumentRedis(replayClient, false)); err != nil {
		_ = client.Close()
		_ = replayClient.Close()
		return nil, fmt.Errorf("redis tracing: %w", err)
	}
	onTransition := m.observeTransition
	var recoveries *recoverySpans
	if tr != nil {
		recoveries = &recoverySpans{tracer: tr.tracer}
		onTransition = func(from, to resilient.BreakerState) {
			m.observeTransition(from, to)
			recoveries.observe(from, to)
		}
	}
	store := redisstore.New(client, redisstore.Config{
		ReplayClient: replayClient,
		Timeout:      cfg.RedisTimeout,
		ResendWindow: cfg.ResendWindow,
		Coalescing:   min(cfg.RedisPipelines, cfg.RedisPoolSize),
		OnDecision: func(_ ratelimit.Request, _ ratelimit.Decision, latency time.Duration) {
			m.observeRedis(nil, latency)
		},
		OnError: func(_ ratelimit.Request, err error, latency time.Duration) {
			m.observeRedis(err, latency)
		},
	})
	rl, err := resilient.New(store, resilient.Config{
		Instance:          cfg.Instance,
		Now:               now,
		LateWindow:        cfg.LateWindow,
		Timeout:           cfg.RedisTimeout,
		ReplayTimeout:     cfg.ReplayTimeout,
		FailureThreshold:  cfg.BreakerFailures,
		ProbeInterval:     cfg.ProbeInterval,
		HeartbeatInterval: cfg.HeartbeatInterval,
		HeartbeatTTL:      cfg.HeartbeatTTL,
		LeaseGrace:        cfg.LeaseGrace,
		ExpectedInstances: cfg.ExpectedInstances,
		KeyCapacity:       cfg.KeyCapacity,
		JournalDir:        cfg.JournalDir,
		JournalMax:        cfg.JournalMax,
		Logger:            log,
		OnTransition:      onTransition,
	})
	if err != nil {
		_ = client.Close()
		_ = replayClient.Close()
		return nil, &ConfigError{Var: "RL_JOURNAL_DIR", Err: err}
	}
	if recoveries != nil {
		recoveries.limiter.Store(rl)
	}
	// Lease mode for the policies that opt in (ratelimit.Policy.Lease);
	// every other request goes straight to rl.
	leased := lease.New(rl, lease.Config{Instance: cfg.Instance, MaxKeys: cfg.KeyCapacity, RefundTimeout: cfg.RedisTimeout + cfg.LateWindow, Timeout: cfg.RedisTimeout})
	log.Info("limiter ready", slog.String("mode", string(ratelimit.ModeRedis)),
		slog.Duration("redis_timeout", cfg.RedisTimeout), slog.Int("redis_pool_size", cfg.RedisPoolSize), slog.Int("redis_pipelines", cfg.RedisPipelines),
		slog.String("journal_dir", cfg.JournalDir))
	return &backend{
		limiter: leased,
		status: func() Status {
			st := rl.Status()
			ls := leased.Stats()
			mode := ratelimit.ModeRedis
			if st.Breaker != string(resilient.BreakerClosed) {
				mode = ratelimit.ModeLocal
			}
			out := Status{
				Mode: string(mode), Breaker: st.Breaker, LiveInstances: int(st.FleetSize),
				JournalSize: int64(st.Journal.Pending), Limiter: &st, Lease: &ls,
			}
			if st.LastRecovery != nil {
				t := st.LastRecovery.UTC()
				out.LastReconciliation = &t
			}
			return out
		},
		close: func(ctx context.Context) error {
			return errors.Join(leased.Close(ctx), rl.Close(ctx), client.Close(), replayClient.Close())
		},
		reset: func(ctx context.Context, identity string, policies []ratelimit.Policy) (string, error) {
			return "fleet", rl.Reset(ctx, identity, policies...)
		},
		inspect: inspectRedis(store, rl, leased, cfg.RedisTimeout),
	}, nil
}
