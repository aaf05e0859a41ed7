// Package ratelimit is the domain of a distributed rate limiter: policies,
// requests and decisions, the Limiter interface every backend implements,
// its errors, and the types a shared store exchanges with the resilient
// limiter (Grant, ReplayBatch, ReplayResult, Fleet, State).
//
// The backends live in their own packages: redisstore (one atomic Lua call
// per decision, time taken from Redis), memstore (the same algorithms in
// process memory) and resilient (a Limiter that wraps Redis with a circuit
// breaker and a local fallback budget). httplimit is the HTTP middleware;
// conformance is the behavioural test suite any Limiter can run. The four
// algorithms are written once in Go, as pure state transitions (an internal
// package), as twins of the Lua scripts in redisstore; one table of test
// vectors runs against both so they cannot drift.
//
// All times inside the algorithms are integer microseconds since the Unix
// epoch, so that Go and Lua compute bit-identical results.
package ratelimit
