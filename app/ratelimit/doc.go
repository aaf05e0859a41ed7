// Package ratelimit is the domain of a distributed rate limiter: policies,
// decisions, the Limiter interface every backend implements, and the four
// algorithms written once as pure state transitions.
//
// The backends live in their own packages: redisstore (one atomic Lua call
// per decision, time taken from Redis), memstore (the same transitions in
// process memory) and resilient (a Limiter that wraps Redis with a circuit
// breaker and a local fallback budget). The pure transitions in this package
// are the Go twins of the Lua scripts in redisstore; one table of test
// vectors runs against both so they cannot drift.
//
// All times inside the algorithms are integer microseconds since the Unix
// epoch, so that Go and Lua compute bit-identical results.
package ratelimit
