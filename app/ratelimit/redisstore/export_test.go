package redisstore

import "github.com/fleetlimit/fleetlimit/app/ratelimit/store"

// MarkerKey returns the idempotency marker of a batch (markerKey), for the
// tests that read it in Redis.
func (l *Store) MarkerKey(b store.ReplayBatch) string { return l.markerKey(b) }
