package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

var (
	//go:embed lua/replay.lua
	replayLua string
	//go:embed lua/replay_token_bucket.lua
	replayTokenBucketLua string
	//go:embed lua/replay_gcra.lua
	replayGCRALua string
	//go:embed lua/replay_sliding_window_counter.lua
	replayWindowCounterLua string
	//go:embed lua/replay_sliding_window_log.lua
	replayWindowLogLua string
)

// replayScripts holds one replay script per algorithm.
var replayScripts = map[ratelimit.Algorithm]*redis.Script{
	ratelimit.TokenBucket:          redis.NewScript(commonLua + replayLua + replayTokenBucketLua),
	ratelimit.GCRA:                 redis.NewScript(commonLua + replayLua + replayGCRALua),
	ratelimit.SlidingWindowCounter: redis.NewScript(commonLua + replayLua + replayWindowCounterLua),
	ratelimit.SlidingWindowLog:     redis.NewScript(commonLua + replayLua + replayWindowLogLua),
}

// MarkerTTL is how long a replay's idempotency marker lives: longer than any
// retry of the same batch (a restart after a crash mid-replay included).
const MarkerTTL = time.Hour

// MarkerKey returns the idempotency marker of a batch: in the key's own
// slot, named by the batch's marker (instance and epoch) and the key.
func (l *Limiter) MarkerKey(b ratelimit.ReplayBatch) string {
	return l.tag(b.Identity) + ":replay:" + b.Marker + ":" + b.Policy.Name + ":" + b.Policy.Fingerprint() + ":" + fmt.Sprintf("%x", b.Identity[:16])
}

// Replay folds journaled batches into Redis, one script per batch, sent in
// one pipeline. results[i] is valid where errs[i] is nil. A batch's marker
// makes it apply at most once: a batch already applied comes back with
// Duplicate set and changes nothing.
func (l *Limiter) Replay(ctx context.Context, batches []ratelimit.ReplayBatch) (results []ratelimit.ReplayResult, errs []error) {
	results = make([]ratelimit.ReplayResult, len(batches))
	errs = make([]error, len(batches))
	cmds := make([]*redis.Cmd, len(batches))
	var now int64
	if l.now != nil {
		now = l.now().UnixMicro()
	}
	pipe, ok := l.client.(redis.Pipeliner)
	if !ok {
		c, isCmdable := l.client.(redis.Cmdable)
		if !isCmdable {
			for i := range errs {
				errs[i] = errors.New("redisstore: replay needs a client that can pipeline")
			}
			return results, errs
		}
		pipe = c.Pipeline()
	}
	for i, b := range batches {
		if err := b.Policy.Validate(); err != nil {
			errs[i] = err
			continue
		}
		ratelimit.SortGrants(b.Grants)
		args := make([]any, 0, 5+3*len(b.Grants))
		args = append(args, now, b.Policy.Limit, b.Policy.WindowMicros(), b.Policy.Capacity(), MarkerTTL.Milliseconds(), len(b.Grants))
		for _, g := range b.Grants {
			args = append(args, g.At, g.Cost, g.ID)
		}
		s := replayScripts[b.Policy.Algorithm]
		// EVALSHA in the pipeline; scripts are loaded first (below).
		cmds[i] = s.EvalSha(ctx, pipe, []string{l.keyOf(b.Policy, b.Identity), l.MarkerKey(b)}, args...)
	}
	if err := l.loadReplayScripts(ctx); err != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		pipe.Discard()
		return results, errs
	}
	_, _ = pipe.Exec(ctx)
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		res, err := cmd.Slice()
		if err != nil {
			errs[i] = classify(ctx, err)
			continue
		}
		results[i], errs[i] = parseReplay(res)
	}
	return results, errs
}

// loadReplayScripts makes sure the replay scripts are cached (on every node
// of a Cluster: SCRIPT LOAD is sent to all masters by go-redis).
func (l *Limiter) loadReplayScripts(ctx context.Context) error {
	for _, s := range replayScripts {
		if err := s.Load(ctx, l.client).Err(); err != nil {
			return classify(ctx, err)
		}
	}
	return nil
}

func parseReplay(res []any) (ratelimit.ReplayResult, error) {
	if len(res) != 4 {
		return ratelimit.ReplayResult{}, fmt.Errorf("%w: replay reply of %d elements", ratelimit.ErrBadReply, len(res))
	}
	var v [4]int64
	for i, x := range res {
		n, ok := x.(int64)
		if !ok || n < 0 {
			return ratelimit.ReplayResult{}, fmt.Errorf("%w: replay reply %v", ratelimit.ErrBadReply, res)
		}
		v[i] = n
	}
	return ratelimit.ReplayResult{Replayed: v[0], Dropped: v[1], Present: v[2], Duplicate: v[3] == 1}, nil
}
