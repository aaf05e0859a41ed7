package redisstore

import (
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// The store contract: a Limiter is a store.Store and implements every
// optional interface, so resilient.New takes it with the whole recovery.
var (
	_ store.Store        = (*Limiter)(nil)
	_ store.Suspender    = (*Limiter)(nil)
	_ store.Warmer       = (*Limiter)(nil)
	_ store.LateReporter = (*Limiter)(nil)
	_ store.Refunder     = (*Limiter)(nil)
	_ store.Sharded      = (*Limiter)(nil)
	_ store.Stager       = (*Limiter)(nil)
	_ store.Lossy        = (*Limiter)(nil)
	_ store.Raiser       = (*Limiter)(nil)
	_ store.Resetter     = (*Limiter)(nil)
)
