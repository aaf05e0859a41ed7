package service

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// LimiterStatus is what the limiter layer reports about itself for /status
// and the gauges of /metrics. A layer leaves what it does not know at zero.
type LimiterStatus struct {
	// Mode is what decides right now: memory, redis, local.
	Mode ratelimit.Mode
	// Breaker is the circuit breaker's state (closed, open, half_open); ""
	// without a breaker.
	Breaker string
	// LiveInstances is the fleet size the fallback budget divides by.
	LiveInstances int
	// JournalSize is the number of locally granted decisions not yet
	// reconciled with Redis.
	JournalSize int64
	// LastReconciliation is when the journal was last replayed; zero: never.
	LastReconciliation time.Time
}

// backend is the limiter the service decides with, how it reports its
// status, and how to release it.
type backend struct {
	limiter ratelimit.Limiter
	status  func() LimiterStatus
	// close releases the limiter at shutdown, within ctx's deadline.
	close func(ctx context.Context) error
}

// newBackend is the one place that picks the limiter implementation.
//
// No Redis configured: the in-memory store (mode "memory"). Redis
// configured: for now the Redis store directly, so a Redis outage reaches the
// middleware as ErrUnavailable and the middleware fails open. Nothing is
// dialled here, so an unreachable Redis does not stop the start.
//
// TODO(resilient): wrap the Redis store in resilient.New(store,
// resilient.Config{Instance, Timeout: cfg.RedisTimeout, ExpectedInstances,
// KeyCapacity, Logger, and the journal in cfg.JournalDir as Recover /
// OnLocalGrant}); return it as the limiter, map its Status() into
// LimiterStatus (Mode "redis" while the breaker is closed, "local" while
// open), and close it (Close(ctx): leaves the fleet) before the client.
func newBackend(cfg Config, m *metrics, log *slog.Logger) (*backend, error) {
	if !cfg.RedisEnabled() {
		mem := memstore.New(memstore.WithCapacity(cfg.KeyCapacity))
		m.watchLocal(mem.Len, mem.Evictions)
		log.Info("limiter ready", slog.String("mode", string(ratelimit.ModeMemory)), slog.Int("key_capacity", cfg.KeyCapacity))
		return &backend{
			limiter: mem,
			status:  func() LimiterStatus { return LimiterStatus{Mode: ratelimit.ModeMemory, LiveInstances: 1} },
			close:   func(context.Context) error { return nil },
		}, nil
	}
	client, err := redisstore.NewClient(redisstore.ClientConfig{
		URL:        cfg.RedisURL,
		Addrs:      cfg.RedisAddrs,
		MasterName: cfg.RedisMasterName,
		Username:   cfg.RedisUsername,
		Password:   cfg.RedisPassword,
		Timeout:    cfg.RedisTimeout,
		PoolSize:   cfg.RedisPoolSize,
	})
	if err != nil {
		return nil, fmt.Errorf("redis client: %w", err)
	}
	store := redisstore.New(client,
		redisstore.WithTimeout(cfg.RedisTimeout),
		redisstore.WithHooks(redisstore.Hooks{
			OnDecision: func(_ ratelimit.Request, _ ratelimit.Decision, latency time.Duration) {
				m.observeRedis(nil, latency)
			},
			OnError: func(_ ratelimit.Request, err error, latency time.Duration) {
				m.observeRedis(err, latency)
			},
		}))
	log.Info("limiter ready", slog.String("mode", string(ratelimit.ModeRedis)),
		slog.Duration("redis_timeout", cfg.RedisTimeout), slog.Int("redis_pool_size", cfg.RedisPoolSize))
	return &backend{
		limiter: store,
		// TODO(resilient): breaker state, live instances, journal size and
		// last reconciliation come from the resilient limiter's Status().
		status: func() LimiterStatus { return LimiterStatus{Mode: ratelimit.ModeRedis} },
		close:  func(context.Context) error { return client.Close() },
	}, nil
}
