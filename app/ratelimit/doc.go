// Package ratelimit is the domain of a distributed rate limiter: policies,
// requests and decisions, the Limiter interface every backend implements,
// and its errors.
//
// The backends live in their own packages: redisstore (one atomic Lua call
// per decision, time taken from Redis), memstore (the same algorithms in
// process memory) and resilient (a Limiter that wraps Redis with a circuit
// breaker and a local fallback budget). The contract between resilient and
// a shared store (replayed grants, heartbeats) is package store: a user of
// the limiter does not need it. httplimit is the HTTP middleware;
// conformance is the behavioural test suite any Limiter can run. The four
// algorithms are written once in Go, as pure state transitions (an internal
// package), as twins of the Lua scripts in redisstore; one table of test
// vectors runs against both so they cannot drift.
//
// All times inside the algorithms are integer microseconds since the Unix
// epoch, so that Go and Lua compute bit-identical results.
//
// "Key" means one thing in this API: Request.Key, the client a policy
// limits (an API key, an address, a descriptor value), as the caller
// names it. What the backends make of it has names of its own: its
// identity (store.Identity, the key's SHA-256: what journals and stores
// keep, so no client bytes are stored), the Redis key of a policy and an
// identity (redisstore's Store.Key), and in process memory a fixed-size
// hash of both (memstore's and the fallback's state).
package ratelimit
