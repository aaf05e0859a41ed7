package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/keycheck"
)

// Sentinel errors. Backends wrap them; test with errors.Is.
var (
	// ErrInvalidPolicy: a policy failed validation (see FieldError).
	ErrInvalidPolicy = errors.New("invalid policy")
	// ErrInvalidRequest: the key or cost of a request is unusable. The
	// caller should answer 400; no state was touched.
	ErrInvalidRequest = errors.New("invalid rate-limit request")
	// ErrUnavailable: the backend could not decide (store unreachable, timed
	// out). The resilient limiter turns it into a local decision.
	ErrUnavailable = errors.New("rate-limit store unavailable")
	// ErrBadReply: the store answered something that is not a valid
	// decision (a key of the wrong type, a reply of the wrong shape).
	ErrBadReply = errors.New("unexpected reply from rate-limit store")
)

// MaxKeyBytes bounds the length of a client identity. Longer keys are
// rejected with ErrInvalidRequest.
const MaxKeyBytes = 256

// Request asks for a decision on one key.
type Request struct {
	// Policy is the limit to apply.
	Policy Policy
	// Key is the client identity (an API key, an IP). It may hold any bytes
	// except control characters, up to MaxKeyBytes; backends hash it before
	// it becomes part of a store key.
	Key string
	// Cost is how many units the request takes; 0 means 1.
	Cost int64
	// ReadOnly asks without counting: the request is decided as one of no
	// units, so nothing is counted, journaled or remembered as admitted,
	// and the decision reports the key as it is. Remaining is then how many
	// units a request could take now; Allowed is false only when the key
	// already holds more than the policy admits (to this instance, which
	// may hold back part of the policy for others). Cost must be 0.
	// Envoy's per-descriptor hits_addend of 0 is such a request.
	ReadOnly bool
	// ID identifies the request, unique across the fleet (nginx's request
	// id, say). The sliding window log stores it as the member of the grant,
	// so the same request decided twice (a timed-out call that still ran,
	// a replay) is counted once, and the Redis backend answers a request
	// with the id of one it admitted moments before (a proxy's resend) as
	// admitted without counting it again (redisstore.Config.ResendWindow).
	// So whoever picks ids decides what counts as a repeat: never take
	// them from clients (see httplimit.Config.TrustedRequestIDs). Empty: the
	// backend makes one up.
	ID string
}

// Units returns the cost with the default filled in: 0 for a read-only
// request, else Cost, and 1 when Cost is 0.
func (r Request) Units() int64 {
	if r.ReadOnly {
		return 0
	}
	if r.Cost == 0 {
		return 1
	}
	return r.Cost
}

// Validate checks the request and its policy.
func (r Request) Validate() error {
	if err := r.Policy.Validate(); err != nil {
		return err
	}
	if err := validateKey(r.Key); err != nil {
		return err
	}
	if r.ReadOnly && r.Cost != 0 {
		return fmt.Errorf("%w: a read-only request has no cost, got %d", ErrInvalidRequest, r.Cost)
	}
	c := r.Units()
	if c < 0 {
		return fmt.Errorf("%w: cost must be positive, got %d", ErrInvalidRequest, r.Cost)
	}
	if c > r.Policy.Capacity() {
		return fmt.Errorf("%w: cost %d exceeds the capacity %d of policy %q", ErrInvalidRequest, c, r.Policy.Capacity(), r.Policy.Name)
	}
	if r.ID != "" {
		if err := validateKey(r.ID); err != nil {
			return fmt.Errorf("request id: %w", err)
		}
		if strings.ContainsAny(r.ID, " #") {
			return fmt.Errorf("%w: request id holds a space or '#'", ErrInvalidRequest)
		}
	}
	return nil
}

// validateKey reports whether key is usable as a client identity: 1 to
// MaxKeyBytes bytes, no ASCII control characters.
func validateKey(key string) error {
	if err := keycheck.Check(key, MaxKeyBytes); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	return nil
}

// Mode says what decided a request.
type Mode string

// The modes, as reported in the X-RateLimit-Mode header.
const (
	ModeRedis  Mode = "redis"  // the shared store decided
	ModeLocal  Mode = "local"  // the local fallback budget decided
	ModeOpen   Mode = "open"   // the policy's fail-open mode allowed it
	ModeClosed Mode = "closed" // the policy's fail-closed mode refused it
	ModeMemory Mode = "memory" // a single instance without a shared store
)

// Decision is the outcome of one request.
type Decision struct {
	Allowed bool
	// Limit is the policy's capacity (quota per window, or bucket size).
	Limit int64
	// Remaining is how many more units would be admitted right now.
	Remaining int64
	// ResetAfter is how long until the full capacity is available again.
	ResetAfter time.Duration
	// RetryAfter is how long until this request would be admitted; 0 when
	// it was.
	RetryAfter time.Duration
	// Mode says what decided.
	Mode Mode
}

// Limiter decides whether requests are admitted.
//
// Decide returns ErrInvalidRequest (or ErrInvalidPolicy) for a request it
// cannot decide; nothing is counted then. Any other error means the backend
// could not decide and the caller chooses how to fail. Implementations are
// safe for concurrent use.
type Limiter interface {
	Decide(ctx context.Context, req Request) (Decision, error)
}

// BatchLimiter is a Limiter that decides several requests in one round
// trip to its store, as a request that several policies count needs (a
// per-key quota and a per-address ceiling, say). DecideBatch returns one
// decision and one error per request, in order; each is what Decide would
// have returned for that request alone. The requests are independent: one
// refused or failed does not undo the others.
type BatchLimiter interface {
	Limiter
	DecideBatch(ctx context.Context, reqs []Request) ([]Decision, []error)
}

// DecideAll decides reqs through l: in one batch when l is a BatchLimiter
// and there is more than one request, else one by one.
func DecideAll(ctx context.Context, l Limiter, reqs []Request) ([]Decision, []error) {
	if b, ok := l.(BatchLimiter); ok && len(reqs) > 1 {
		return b.DecideBatch(ctx, reqs)
	}
	ds, errs := make([]Decision, len(reqs)), make([]error, len(reqs))
	for i, r := range reqs {
		ds[i], errs[i] = l.Decide(ctx, r)
	}
	return ds, errs
}
