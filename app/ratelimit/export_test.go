package ratelimit

import "time"

// LeaseMax exposes Policy.leaseMax to the external tests.
func LeaseMax(p Policy) time.Duration { return p.leaseMax() }
