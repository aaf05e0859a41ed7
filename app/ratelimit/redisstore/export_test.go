package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"

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

// Ext is the store's extension (contract.Extension), for the external
// tests.
func (l *Store) Ext() ext { return ext{l} }

// DecideWire decides one request as the extension does (decide): with its
// weight and hold, and with the state.
func (l *Store) DecideWire(ctx context.Context, req contract.Request) (contract.Decision, error) {
	return l.decide(ctx, req)
}

// OptionsForTest returns c's universal options (options).
func (c ClientConfig) OptionsForTest() (*redis.UniversalOptions, error) { return c.options() }
