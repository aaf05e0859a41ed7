package redisstore

import (
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// A Store implements store.Store and every optional interface of the store
// contract, so resilient.New takes it with the whole recovery.
var (
	_ store.Store        = (*Store)(nil)
	_ store.Suspender    = (*Store)(nil)
	_ store.Warmer       = (*Store)(nil)
	_ store.LateReporter = (*Store)(nil)
	_ store.Refunder     = (*Store)(nil)
	_ store.Sharded      = (*Store)(nil)
	_ store.Stager       = (*Store)(nil)
	_ store.Lossy        = (*Store)(nil)
	_ store.Raiser       = (*Store)(nil)
	_ store.Resetter     = (*Store)(nil)
)
