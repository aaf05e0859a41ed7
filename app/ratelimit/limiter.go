package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
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
	// already holds more than the policy admits (under a stricter Weight,
	// say). Cost must be 0. Envoy's per-descriptor hits_addend of 0 is such
	// a request.
	ReadOnly bool
	// ID identifies the request, unique across the fleet (nginx's request
	// id, say). The sliding window log stores it as the member of the grant,
	// so the same request decided twice (a timed-out call that still ran,
	// a replay) is counted once, and the Redis backend answers a request
	// with the id of one it admitted moments before (a proxy's resend) as
	// admitted without counting it again (redisstore.WithResendWindow).
	// So whoever picks ids decides what counts as a repeat: never take
	// them from clients (see httplimit.WithTrustedRequestIDs). Empty: the
	// backend makes one up.
	ID string
	// Weight holds back part of the policy for instances deciding
	// elsewhere; the zero value decides with the whole policy.
	Weight Weight
	// Hold asks for units that will be used at any time within Hold of
	// the decision (a lease, package lease), and so are counted as used at
	// its end: GCRA's theoretical arrival time moves to at least the
	// decision's time plus Hold before the cost is added. Admitted so, no
	// use of the units within Hold can exceed what GCRA admits over any
	// interval. The Redis store honours it for GCRA; other backends decide
	// as if it were 0, and the lease layer takes no lease from them. At
	// most the window or the time the policy takes to refill its capacity,
	// whichever is longer (a lease, at most Policy.LeaseMax, may outlive
	// the window when the burst exceeds the limit); 0 for other
	// algorithms.
	Hold time.Duration
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
	if err := ValidateKey(r.Key); err != nil {
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
	if most := max(r.Policy.Window, 4*r.Policy.LeaseMax()); r.Hold < 0 || r.Hold > 0 && (r.Hold > most || r.Policy.Algorithm != GCRA || r.ReadOnly) {
		return fmt.Errorf("%w: hold %v: at most %v (the window or the capacity's refill time), and only for a gcra request that counts", ErrInvalidRequest, r.Hold, most)
	}
	if !r.Weight.Valid() {
		return fmt.Errorf("%w: invalid weight %d/%d", ErrInvalidRequest, r.Weight.Num, r.Weight.Den)
	}
	if r.ID != "" {
		if err := ValidateKey(r.ID); err != nil {
			return fmt.Errorf("request id: %w", err)
		}
		if strings.ContainsAny(r.ID, " #") {
			return fmt.Errorf("%w: request id holds a space or '#'", ErrInvalidRequest)
		}
	}
	return nil
}

// ValidateKey reports whether key is usable as a client identity: 1 to
// MaxKeyBytes bytes, no ASCII control characters.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidRequest)
	}
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("%w: key longer than %d bytes", ErrInvalidRequest, MaxKeyBytes)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] == 0x7f {
			return fmt.Errorf("%w: key holds a control character", ErrInvalidRequest)
		}
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
	// State is the algorithm state after the decision, in the deciding
	// backend's clock, for a fallback to continue from.
	State State
	// ResendID is set on a refusal by a backend that takes a request with
	// the id of one it admitted moments before for a resend of it (and
	// admits it without counting it again): the id of the key's last
	// admission, which it would admit so until ResendUntil (µs since the
	// epoch, the backend's clock). A cache of this refusal must not answer
	// a request with that id before then. Empty: no such admission. A
	// backend may keep ids in a short form (redisstore keeps those of 11
	// bytes or more as an 11-byte hash): the id is in that form.
	ResendID    string
	ResendUntil int64
	// Weight is the weight a resilient limiter's store decision charged
	// the request at (the zero value: 1/1); a refund of the admission
	// gives back at this weight, whatever the weight is when it is made.
	Weight Weight
}

// State is an algorithm's state after a decision, as a backend reports it.
// Only the fields of the policy's algorithm are set.
type State struct {
	// Now is the deciding backend's time, µs since the Unix epoch (Redis
	// TIME for the Redis backend).
	Now int64
	// Tokens is the token bucket's level, scaled by the window in µs
	// (tokens × Window µs), so refills stay integral.
	Tokens int64
	// TAT is GCRA's theoretical arrival time: TAT µs since the epoch plus
	// TATRem/Limit µs.
	TAT, TATRem int64
	// WindowStart, Current and Previous are the sliding window counter's
	// aligned window (µs since the epoch) and the counts of it and the one
	// before.
	WindowStart, Current, Previous int64
	// Ages is the sliding window log's histogram: Ages[i] grants are between
	// i and i+1 eighths of a window old.
	Ages [AgeBuckets]int64
}

// AgeBuckets is the resolution of the sliding window log's age histogram.
const AgeBuckets = 8

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
