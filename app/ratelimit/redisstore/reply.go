// Reading Redis' answers: a decision script's reply into a Decision, and
// an error into what the caller can act on (unavailable, or a bad reply).

package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

// replyHead is the length of the part of a decision script's reply that is
// the same for every algorithm: allowed, remaining, reset, retry, now.
const replyHead = 5

// replyLen is the length of algorithm a's decision reply: the head, then
// only the state the fallback continues from (see lua/decide.lua).
func replyLen(a ratelimit.Algorithm) int {
	switch a {
	case ratelimit.TokenBucket:
		return replyHead + 1
	case ratelimit.GCRA:
		return replyHead + 2
	case ratelimit.SlidingWindowCounter:
		return replyHead + 3
	case ratelimit.SlidingWindowLog:
		return replyHead + contract.AgeBuckets
	}
	return -1
}

// parseReply turns algorithm a's script reply into a decision, checking
// every element.
func parseReply(a ratelimit.Algorithm, res []any) (contract.Decision, error) {
	n := replyLen(a)
	var resendID string
	var resendUntil int64
	if len(res) == n+2 { // a refusal's resend hint (lua/decide.lua, resend_hint)
		id, ok1 := res[n].(string)
		until, ok2 := res[n+1].(int64)
		if !ok1 || !ok2 || id == "" || until <= 0 || res[0] != int64(0) {
			return contract.Decision{}, fmt.Errorf("%w: resend hint %v", ratelimit.ErrBadReply, res[n:])
		}
		resendID, resendUntil, res = id, until, res[:n]
	}
	if len(res) != n {
		return contract.Decision{}, fmt.Errorf("%w: %d elements, want %d", ratelimit.ErrBadReply, len(res), n)
	}
	var v [replyHead + contract.AgeBuckets]int64
	for i, x := range res {
		n, ok := x.(int64)
		if !ok {
			return contract.Decision{}, fmt.Errorf("%w: element %d is %T, want an integer", ratelimit.ErrBadReply, i, x)
		}
		v[i] = n
	}
	if v[0] != 0 && v[0] != 1 || v[1] < 0 || v[2] < 0 || v[3] < 0 || v[4] <= 0 {
		return contract.Decision{}, fmt.Errorf("%w: out-of-range values %v", ratelimit.ErrBadReply, v[:replyHead])
	}
	d := contract.Decision{
		Decision: ratelimit.Decision{
			Allowed:    v[0] == 1,
			Remaining:  v[1],
			ResetAfter: time.Duration(v[2]) * time.Microsecond,
			RetryAfter: time.Duration(v[3]) * time.Microsecond,
		},
		State:    contract.State{Now: v[4]},
		ResendID: resendID, ResendUntil: resendUntil,
	}
	st, s := &d.State, v[replyHead:]
	switch a {
	case ratelimit.TokenBucket:
		st.Tokens = s[0]
	case ratelimit.GCRA:
		st.TAT, st.TATRem = s[0], s[1]
	case ratelimit.SlidingWindowCounter:
		st.WindowStart, st.Current, st.Previous = s[0], s[1], s[2]
	case ratelimit.SlidingWindowLog:
		copy(st.Ages[:], s)
	}
	return d, nil
}

// unavailablePrefixes are Redis error replies that mean "cannot serve now"
// rather than "this request is wrong": among them the refusals to write (OOM
// under maxmemory with noeviction, MISCONF when persistence fails, READONLY
// on a replica), which are an outage for a limiter whose every decision
// writes, and the refusals of the connection itself (NOAUTH, WRONGPASS,
// NOPERM: a password or an ACL that changed, which every call meets).
var unavailablePrefixes = []string{"NOSCRIPT", "LOADING", "READONLY", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "BUSY",
	"NOREPLICAS", "MOVED", "ASK", "OOM", "MISCONF", "NOAUTH", "WRONGPASS", "NOPERM"}

// unavailableMessages are error replies that Redis gives with the generic
// ERR prefix but that mean it cannot serve now: a full connection table,
// and a call too long for a client that has not authenticated (Redis
// answers that before NOAUTH to a decision's EVALSHA), and a function the
// node lacks still after the library was loaded (a failover between the
// load and the call).
var unavailableMessages = []string{"ERR max number of clients reached", "ERR Protocol error: unauthenticated", "ERR Function not found"}

// unavailableReply reports whether a Redis error reply means "cannot serve
// now": it starts with one of unavailablePrefixes (Redis 7 passes the error
// of a command a script called through with its own prefix) or carries one
// as "-PREFIX" inside a script error (Redis 6 wraps it: "ERR Error running
// script ...: -OOM command not allowed ...").
func unavailableReply(msg string) bool {
	for _, p := range unavailablePrefixes {
		if strings.HasPrefix(msg, p) || strings.Contains(msg, ": -"+p+" ") {
			return true
		}
	}
	for _, m := range unavailableMessages {
		if strings.HasPrefix(msg, m) {
			return true
		}
	}
	return false
}

// classify wraps err as ErrUnavailable (the store cannot decide now: network,
// timeout, a server that is loading, read-only, out of memory or refusing
// this client) or ErrBadReply (the store answered, but not with a
// decision). A cancelled caller context is returned as is.
func classify(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			// The call outlived its deadline: the store did not answer
			// in time, which is unavailability (and still a deadline).
			return fmt.Errorf("%w: redisstore: %w", ratelimit.ErrUnavailable, cerr)
		}
		return fmt.Errorf("redisstore: %w", cerr)
	}
	var rerr redis.Error
	if errors.As(err, &rerr) && !isNetError(err) {
		if unavailableReply(rerr.Error()) {
			return fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
		}
		return fmt.Errorf("%w: %w", ratelimit.ErrBadReply, err)
	}
	if errors.Is(err, ratelimit.ErrBadReply) {
		return err
	}
	return fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded)
}
