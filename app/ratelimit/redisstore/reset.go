package redisstore

import (
	"context"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// Resets. An operator lifts one identity's limits under some policies
// (Reset): its state keys go, and the reset goes into the fleet's reset log,
// a stream under the fleet's hash tag that every instance reads at each
// heartbeat from the last entry it saw (ReadResets), so that each forgets
// what it holds of the identity within one heartbeat. The log keeps the
// newest resetLogMax entries, for resetLogTTL after the last reset: an
// instance cut off from Redis for longer than that, while more resets than
// that were made, misses the oldest of them.

//go:embed lua/reset.lua
var resetLua string

const (
	// fenceLua deletes the state keys KEYS[1..ARGV[1]] (of one hash
	// tag) and sets each one's fence, KEYS[ARGV[1]+i], to the reset's time
	// ARGV[2] for ARGV[3] ms: a replay of grants from before it is refused
	// (lua/replay.lua).
	fenceLua = `local n = tonumber(ARGV[1])
redis.call('DEL', unpack(KEYS, 1, n))
for i = n + 1, #KEYS do redis.call('SET', KEYS[i], ARGV[2], 'PX', ARGV[3]) end
return n`
	// readResetsLua returns Redis' time (µs, a string) and the log's
	// entries after ARGV[1] (from its start when empty), at most ARGV[2].
	readResetsLua = `local t = redis.call('TIME')
local now = t[1] .. string.format('%06d', tonumber(t[2]))
local from = '-'
if ARGV[1] ~= '' then from = '(' .. ARGV[1] end
return {now, redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', ARGV[2])}`
)

// Bounds of the reset log.
const (
	resetLogMax = 1000
	resetLogTTL = 24 * time.Hour
)

// resetLogKey is the stream of resets, in the fleet's hash slot.
func (l *Store) resetLogKey() string { return "{" + l.prefix + ":fleet}:resets" }

// Reset lifts identity's limits under policies: it appends one entry per
// policy to the reset log, with the reset's time (Redis TIME), then deletes
// the identity's state under each of them and fences each key with that
// time (one script: the keys share the identity's hash tag). The fence
// (resetLogTTL) refuses a replay of grants from before the reset by an
// instance that has not read the log since (contract.ErrFenced): the usage
// the reset lifted never comes back. An error after the log says that the
// state may not be deleted: send the reset again.
func (l *Store) Reset(ctx context.Context, identity string, policies ...ratelimit.Policy) error {
	if err := contract.ValidateKey(identity); err != nil {
		return err
	}
	if len(policies) == 0 {
		return fmt.Errorf("%w: no policy to reset", ratelimit.ErrInvalidRequest)
	}
	id := store.IdentityOf(identity)
	keys := make([]string, 2*len(policies))
	args := []any{resetLogMax, resetLogTTL.Milliseconds(), hex.EncodeToString(id[:]), len(policies)}
	for i, p := range policies {
		if err := p.Validate(); err != nil {
			return err
		}
		keys[i] = l.keyOf(p, id)
		keys[len(policies)+i] = fenceKey(keys[i])
		args = append(args, p.Name, string(p.Algorithm), p.Limit, p.Window.Microseconds(), p.Capacity())
	}
	callCtx, cancel := l.callContext(ctx)
	defer cancel()
	at, err := fcall(callCtx, l.client, fnReset, []string{l.resetLogKey()}, args...).Text()
	if err != nil {
		return fmt.Errorf("reset: log: %w", classify(ctx, err))
	}
	if err := fcall(callCtx, l.client, fnFence, keys, len(policies), at, resetLogTTL.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("reset: delete: %w", classify(ctx, err))
	}
	return nil
}

// fenceKey is the key that holds the time of the last reset of the state
// key k (same hash tag).
func fenceKey(k string) string { return k + ":reset" }

// ReadResets calls apply for each reset logged after the entry after, in
// order, with the reset's time, and returns the id of the last entry read
// (after itself when there is none), to pass as after next time, and Redis'
// time of the read (µs; when it read resetLogMax entries and more may
// follow, the time of the last reset read). With after empty it reads the log from its start:
// an instance that starts may have reloaded a journal of grants from before
// a reset it has not seen. An entry that does not parse is skipped.
func (l *Store) readResets(ctx context.Context, after string, apply func(ratelimit.Policy, store.Identity, int64)) (string, int64, error) {
	callCtx, cancel := l.callContext(ctx)
	defer cancel()
	reply, err := fcallRO(callCtx, l.client, fnReadResets, []string{l.resetLogKey()}, after, resetLogMax).Slice()
	if err != nil {
		return after, 0, fmt.Errorf("read resets: %w", classify(ctx, err))
	}
	var read int64
	var res []any
	if len(reply) == 2 {
		s, _ := reply[0].(string)
		read, err = strconv.ParseInt(s, 10, 64)
		res, _ = reply[1].([]any)
	}
	if len(reply) != 2 || err != nil || read <= 0 {
		return after, 0, fmt.Errorf("%w: reset log read %v", ratelimit.ErrBadReply, reply)
	}
	last := after
	if last == "" {
		last = "0-0"
	}
	var lastAt int64
	for _, x := range res {
		e, ok := x.([]any)
		if !ok || len(e) != 2 {
			return last, read, fmt.Errorf("%w: reset log entry %v", ratelimit.ErrBadReply, x)
		}
		entryID, ok1 := e[0].(string)
		fields, ok2 := e[1].([]any)
		if !ok1 || !ok2 {
			return last, read, fmt.Errorf("%w: reset log entry %v", ratelimit.ErrBadReply, x)
		}
		last = entryID
		if p, id, at, ok := parseReset(fields); ok {
			apply(p, id, at)
			lastAt = at
		}
	}
	if len(res) >= resetLogMax {
		// More may follow: the read covers the resets up to the last one
		// applied, not up to now (store.ReplayBatch.ResetsRead).
		read = lastAt
	}
	return last, read, nil
}

// parseReset reads one reset log entry's fields (lua/reset.lua): its
// policy, identity and time.
func parseReset(fields []any) (ratelimit.Policy, store.Identity, int64, bool) {
	f := make(map[string]string, len(fields)/2)
	for i := 0; i+1 < len(fields); i += 2 {
		k, ok1 := fields[i].(string)
		v, ok2 := fields[i+1].(string)
		if !ok1 || !ok2 {
			return ratelimit.Policy{}, store.Identity{}, 0, false
		}
		f[k] = v
	}
	var id store.Identity
	b, err := hex.DecodeString(f["id"])
	if err != nil || len(b) != len(id) {
		return ratelimit.Policy{}, store.Identity{}, 0, false
	}
	copy(id[:], b)
	alg, err := ratelimit.ParseAlgorithm(f["algorithm"])
	limit, err1 := strconv.ParseInt(f["limit"], 10, 64)
	window, err2 := strconv.ParseInt(f["window"], 10, 64)
	capacity, err3 := strconv.ParseInt(f["capacity"], 10, 64)
	if err != nil || err1 != nil || err2 != nil || err3 != nil {
		return ratelimit.Policy{}, store.Identity{}, 0, false
	}
	p := ratelimit.Policy{Name: f["policy"], Algorithm: alg, Limit: limit, Window: time.Duration(window) * time.Microsecond}
	if alg == ratelimit.TokenBucket || alg == ratelimit.GCRA {
		p.Burst = capacity
	}
	at, err := strconv.ParseInt(f["at"], 10, 64)
	if p.Validate() != nil || p.Capacity() != capacity || err != nil {
		return ratelimit.Policy{}, store.Identity{}, 0, false
	}
	return p, id, at, true
}
