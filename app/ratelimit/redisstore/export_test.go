package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// MarkerKey returns the idempotency marker of a batch (markerKey), for the
// tests that read it in Redis.
func (l *Store) MarkerKey(b store.ReplayBatch) string { return l.markerKey(b) }

// RedisInfo reads INFO cpu and commandstats (readRedisInfo): the process'
// CPU so far in µs, and the calls and µs of commands, summed (as
// commandstats names them: "fcall", "function|load").
func RedisInfo(ctx context.Context, c *redis.Client, commands ...string) (cpuUS, calls, us float64, err error) {
	ri, err := readRedisInfo(ctx, c)
	for _, command := range commands {
		st := ri.commands[command]
		calls, us = calls+st.calls, us+st.us
	}
	return ri.cpuUS, calls, us, err
}

// RedisConnections reads how many connections the server has accepted
// (INFO stats, through readRedisInfo).
func RedisConnections(ctx context.Context, c *redis.Client) (int64, error) {
	ri, err := readRedisInfo(ctx, c)
	return ri.connections, err
}

// Names the external tests read (the package keeps them unexported).
const (
	MaxReplayGrants = maxReplayGrants
	ResetLogTTL     = resetLogTTL
)

// LibraryVersion is the function library's version (libraryVersion, set
// by the package's init).
func LibraryVersion() string { return libraryVersion }

// ResetLogKey is the fleet's reset log (resetLogKey).
func (l *Store) ResetLogKey() string { return l.resetLogKey() }

// The store's part of the recovery contract (ext), for the external tests.
func (l *Store) OnLate(window time.Duration, fn func(contract.LateReply)) bool {
	return l.onLate(window, fn)
}
func (l *Store) FleetKey() string   { return l.fleetKey() }
func (l *Store) LostWrites() uint64 { return l.lostWrites() }
func (l *Store) Sharded() bool      { return l.sharded() }
func (l *Store) Suspend(ctx context.Context, instance string, ttl, grace time.Duration) error {
	return l.suspend(ctx, instance, ttl, grace)
}
func (l *Store) Raise(ctx context.Context, floors []contract.Floor) ([]int64, []error) {
	return l.raise(ctx, floors)
}
func (l *Store) ReadResets(ctx context.Context, after string, apply func(ratelimit.Policy, store.Identity, int64)) (string, int64, error) {
	return l.readResets(ctx, after, apply)
}
func (l *Store) Refund(ctx context.Context, req contract.Request, d contract.Decision) (int64, error) {
	return l.refund(ctx, req, d)
}

// DecideWire and DecideBatchWire decide as the extension does (decide,
// decideBatch): with weights and holds, and with the states.
func (l *Store) DecideWire(ctx context.Context, req contract.Request) (contract.Decision, error) {
	return l.decide(ctx, req)
}
func (l *Store) DecideBatchWire(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	return l.decideBatch(ctx, reqs)
}
