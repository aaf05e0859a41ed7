package ratelimit

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names a rate-limiting algorithm.
type Algorithm string

// The supported algorithms.
const (
	// TokenBucket holds up to Burst tokens and refills Limit tokens per
	// Window. Bursts up to the capacity, then a smooth rate.
	TokenBucket Algorithm = "token_bucket"
	// SlidingWindowLog keeps one entry per granted unit and admits at most
	// Limit units in any window of length Window. Exact; memory grows with
	// Limit per key.
	SlidingWindowLog Algorithm = "sliding_window_log"
	// SlidingWindowCounter keeps the counts of the current and previous
	// aligned windows and weights the previous one by how much of it still
	// overlaps the sliding window. O(1) memory; an approximation of the log.
	SlidingWindowCounter Algorithm = "sliding_window_counter"
	// GCRA (generic cell rate algorithm) keeps one theoretical arrival time
	// per key. Same admissions as a token bucket of capacity Burst, in one
	// number.
	GCRA Algorithm = "gcra"
)

// ParseAlgorithm returns the Algorithm named s. It accepts the canonical
// names and their hyphenated forms ("token-bucket").
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "token_bucket", "token-bucket":
		return TokenBucket, nil
	case "sliding_window_log", "sliding-window-log":
		return SlidingWindowLog, nil
	case "sliding_window_counter", "sliding-window-counter":
		return SlidingWindowCounter, nil
	case "gcra":
		return GCRA, nil
	}
	return "", fmt.Errorf("%w: unknown algorithm %q", ErrInvalidPolicy, s)
}

// Bounds on policy parameters. They keep every intermediate value of the
// algorithms below 2^53, so that the Lua twins (which compute in float64)
// stay exact.
const (
	MaxLimit     = 1_000_000_000
	minWindow    = time.Millisecond
	maxWindow    = 31 * 24 * time.Hour
	maxScaled    = 1 << 50
	maxNameBytes = 64
)

// Policy is one rate limit. The zero value is not valid; build one as a
// literal and call Validate (backends validate every policy they are given).
//
// For the window algorithms Limit is the quota per Window. For TokenBucket and
// GCRA, Burst is the capacity (0 means Limit) and the rate is Limit per
// Window, so a capacity of 100 refilled over 10 s is {Limit: 100, Window: 10s}.
type Policy struct {
	// Name identifies the policy in keys, headers and metrics: 1 to 64
	// bytes of [A-Za-z0-9_.-].
	Name      string
	Algorithm Algorithm
	// Limit is at most MaxLimit.
	Limit int64
	// Window is 1ms to 31 days.
	Window time.Duration
	// Burst is the capacity of TokenBucket and GCRA; 0 means Limit.
	Burst int64
	// FailureMode says what decides for the policy while a resilient
	// limiter's shared store is out: ModeLocal (the default, ""), a local
	// budget, this instance's share of what the store last said was left;
	// ModeOpen, allow every request; ModeClosed, refuse every request (for
	// limits that guard logins and the like).
	FailureMode Mode
	// FallbackFactor scales this instance's fallback share (0 means 1; 0.5
	// gives a stricter outage budget). At most 1.
	FallbackFactor float64
	// Shadow marks a dry-run policy: decided and reported, never enforced.
	// The middleware honours it; limiters decide as usual.
	Shadow bool
	// Lease opts a GCRA policy into lease mode (package lease): an
	// instance takes a hot key's units from the store several at a time
	// and answers from them for at most Lease. 0: every request is decided
	// in the store. At most a quarter of the time the policy takes to
	// refill its capacity.
	Lease time.Duration
}

// leaseMax is the longest lease the policy allows: a quarter of the time
// it takes to refill its capacity (Capacity × Window / Limit). A lease of
// L units held for d costs the key up to L units plus d of refill (package
// lease), so d must stay well short of that time.
func (p Policy) leaseMax() time.Duration {
	if p.Limit <= 0 {
		return 0
	}
	return time.Duration(float64(p.Window) * float64(p.Capacity()) / float64(p.Limit) / 4)
}

// Capacity is the most units the policy admits at once: Burst for
// TokenBucket and GCRA (when set), Limit otherwise.
func (p Policy) Capacity() int64 {
	if (p.Algorithm == TokenBucket || p.Algorithm == GCRA) && p.Burst > 0 {
		return p.Burst
	}
	return p.Limit
}

// ValidateName reports whether s can name a policy (or an instance): 1 to 64
// bytes of [A-Za-z0-9_.-], safe in a Redis key, a header, a log line and a
// file name.
func ValidateName(s string) error {
	if s == "" || len(s) > maxNameBytes {
		return fmt.Errorf("must be 1 to %d bytes, got %d", maxNameBytes, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return errors.New("may hold only letters, digits, '_', '-' and '.'")
		}
	}
	return nil
}

// Validate reports the first invalid field as a *FieldError wrapping
// ErrInvalidPolicy.
func (p Policy) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Policy: p.Name, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if err := ValidateName(p.Name); err != nil {
		return bad("name", "%v", err)
	}
	switch p.Algorithm {
	case TokenBucket, SlidingWindowLog, SlidingWindowCounter, GCRA:
	default:
		return bad("algorithm", "unknown algorithm %q", p.Algorithm)
	}
	if p.Limit <= 0 || p.Limit > MaxLimit {
		return bad("limit", "must be between 1 and %d, got %d", MaxLimit, p.Limit)
	}
	if p.Window < minWindow || p.Window > maxWindow {
		return bad("window", "must be between %v and %v, got %v", minWindow, maxWindow, p.Window)
	}
	if p.Burst < 0 || p.Burst > MaxLimit {
		return bad("burst", "must be between 0 and %d, got %d", MaxLimit, p.Burst)
	}
	if p.Burst > 0 && p.Algorithm != TokenBucket && p.Algorithm != GCRA {
		return bad("burst", "applies only to token_bucket and gcra")
	}
	w := p.Window.Microseconds()
	if p.Capacity() > maxScaled/w || p.Limit > maxScaled/w {
		return bad("window", "limit × window is too large (at most 2^50 request-microseconds)")
	}
	switch p.FailureMode {
	case "", ModeLocal, ModeOpen, ModeClosed:
	default:
		return bad("failure_mode", "must be local, open or closed, got %q", p.FailureMode)
	}
	if !(p.FallbackFactor >= 0 && p.FallbackFactor <= 1) { // NaN fails both
		return bad("fallback_factor", "must be in (0, 1], got %v", p.FallbackFactor)
	}
	if p.Lease != 0 {
		switch {
		case p.Algorithm != GCRA:
			return bad("lease", "applies only to gcra")
		case p.Lease < time.Millisecond || p.Lease > p.leaseMax():
			return bad("lease", "must be between 1ms and a quarter of the time the capacity takes to refill (%v), got %v", p.leaseMax(), p.Lease)
		}
	}
	return nil
}

// FieldError is a policy field that failed validation.
type FieldError struct {
	Policy string
	Field  string
	Reason string
}

func (e *FieldError) Error() string {
	if e.Policy == "" {
		return fmt.Sprintf("invalid policy: %s %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("invalid policy %q: %s %s", e.Policy, e.Field, e.Reason)
}

// Unwrap returns ErrInvalidPolicy.
func (e *FieldError) Unwrap() error { return ErrInvalidPolicy }
