package redisstore

import (
	"context"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// Resets. An operator lifts one identity's limits under some policies
// (Reset): its state keys go, and the reset goes into the fleet's reset log,
// a stream under the fleet's hash tag that every instance reads at each
// heartbeat from the last entry it saw (ReadResets), so that each forgets
// what it holds of the identity within one heartbeat. The log keeps the
// newest ResetLogMax entries, for ResetLogTTL after the last reset: an
// instance cut off from Redis for longer than that, while more resets than
// that were made, misses the oldest of them.

//go:embed lua/reset.lua
var resetLua string

var (
	resetScript = redis.NewScript(resetLua)
	// delScript deletes its keys (of one hash tag), on any client.
	delScript = redis.NewScript(`return redis.call('DEL', unpack(KEYS))`)
	// readResetsScript returns the log's entries after ARGV[1], at most
	// ARGV[2]; with ARGV[1] empty, only its last entry ({} when empty).
	readResetsScript = redis.NewScript(`if ARGV[1] == '' then
  return redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
end
return redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])`)
)

// Bounds of the reset log.
const (
	ResetLogMax = 1000
	ResetLogTTL = 24 * time.Hour
)

// ResetLogKey is the stream of resets, in the fleet's hash slot.
func (l *Store) ResetLogKey() string { return "{" + l.prefix + ":fleet}:resets" }

// Reset lifts identity's limits under policies: it deletes the identity's
// state under each of them (one DEL: the keys share the identity's hash
// tag), then appends one entry per policy to the reset log. An error after
// the delete says that the log was not written: the state is gone, but the
// other instances were not told.
func (l *Store) Reset(ctx context.Context, identity string, policies []ratelimit.Policy) error {
	if err := ratelimit.ValidateKey(identity); err != nil {
		return err
	}
	if len(policies) == 0 {
		return fmt.Errorf("%w: no policy to reset", ratelimit.ErrInvalidRequest)
	}
	id := store.IdentityOf(identity)
	keys := make([]string, len(policies))
	args := []any{ResetLogMax, ResetLogTTL.Milliseconds(), hex.EncodeToString(id[:]), len(policies)}
	for i, p := range policies {
		if err := p.Validate(); err != nil {
			return err
		}
		keys[i] = l.keyOf(p, id)
		args = append(args, p.Name, string(p.Algorithm), p.Limit, p.WindowMicros(), p.Capacity())
	}
	callCtx, cancel := l.callContext(ctx)
	defer cancel()
	if err := delScript.Run(callCtx, l.client, keys).Err(); err != nil {
		return fmt.Errorf("reset: delete: %w", classify(ctx, err))
	}
	if err := resetScript.Run(callCtx, l.client, []string{l.ResetLogKey()}, args...).Err(); err != nil {
		return fmt.Errorf("reset: log: %w", classify(ctx, err))
	}
	return nil
}

// ReadResets calls apply for each reset logged after the entry after, in
// order, and returns the id of the last entry read (after itself when there
// is none), to pass as after next time. With after empty it only finds where
// the log ends ("0-0" when it is empty): an instance that starts holds
// nothing a reset made before it could clear. An entry that does not parse
// is skipped.
func (l *Store) ReadResets(ctx context.Context, after string, apply func(ratelimit.Policy, store.Identity)) (string, error) {
	callCtx, cancel := l.callContext(ctx)
	defer cancel()
	res, err := readResetsScript.Run(callCtx, l.client, []string{l.ResetLogKey()}, after, ResetLogMax).Slice()
	if err != nil {
		if errors.Is(err, redis.Nil) {
			res, err = nil, nil
		} else {
			return after, fmt.Errorf("read resets: %w", classify(ctx, err))
		}
	}
	last := after
	if last == "" {
		last = "0-0"
	}
	for _, x := range res {
		e, ok := x.([]any)
		if !ok || len(e) != 2 {
			return last, fmt.Errorf("%w: reset log entry %v", ratelimit.ErrBadReply, x)
		}
		entryID, ok1 := e[0].(string)
		fields, ok2 := e[1].([]any)
		if !ok1 || !ok2 {
			return last, fmt.Errorf("%w: reset log entry %v", ratelimit.ErrBadReply, x)
		}
		last = entryID
		if after == "" {
			continue // only where the log ends
		}
		if p, id, ok := parseReset(fields); ok {
			apply(p, id)
		}
	}
	return last, nil
}

// parseReset reads one reset log entry's fields (lua/reset.lua).
func parseReset(fields []any) (ratelimit.Policy, store.Identity, bool) {
	f := make(map[string]string, len(fields)/2)
	for i := 0; i+1 < len(fields); i += 2 {
		k, ok1 := fields[i].(string)
		v, ok2 := fields[i+1].(string)
		if !ok1 || !ok2 {
			return ratelimit.Policy{}, store.Identity{}, false
		}
		f[k] = v
	}
	var id store.Identity
	b, err := hex.DecodeString(f["id"])
	if err != nil || len(b) != len(id) {
		return ratelimit.Policy{}, store.Identity{}, false
	}
	copy(id[:], b)
	alg, err := ratelimit.ParseAlgorithm(f["algorithm"])
	limit, err1 := strconv.ParseInt(f["limit"], 10, 64)
	window, err2 := strconv.ParseInt(f["window"], 10, 64)
	capacity, err3 := strconv.ParseInt(f["capacity"], 10, 64)
	if err != nil || err1 != nil || err2 != nil || err3 != nil {
		return ratelimit.Policy{}, store.Identity{}, false
	}
	p := ratelimit.Policy{Name: f["policy"], Algorithm: alg, Limit: limit, Window: time.Duration(window) * time.Microsecond}
	if alg == ratelimit.TokenBucket || alg == ratelimit.GCRA {
		p.Burst = capacity
	}
	if p.Validate() != nil || p.Capacity() != capacity {
		return ratelimit.Policy{}, store.Identity{}, false
	}
	return p, id, true
}
