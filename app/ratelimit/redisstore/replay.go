package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
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

// MaxReplayGrants bounds the grants one replay script call folds in: a
// batch with more (a hot key's whole outage) is sent as several calls, in
// order, each with a marker of its own, so no single call holds Redis for
// long (about 2.5 µs of Lua per grant) and the other instances' decisions
// are served between them.
const MaxReplayGrants = 1000

// Replay folds journaled batches into Redis, one script call per batch (per
// MaxReplayGrants grants of a batch), sent in one pipeline on the replay
// client. results[i] is valid where errs[i] is nil. A marker per call makes
// each apply at most once: a batch already applied comes back with
// Duplicate set and changes nothing; a batch of which only some calls had
// been applied (a pipeline that failed part-way) applies the rest and
// reports the others' units as DuplicateUnits.
func (l *Limiter) Replay(ctx context.Context, batches []ratelimit.ReplayBatch) (results []ratelimit.ReplayResult, errs []error) {
	results = make([]ratelimit.ReplayResult, len(batches))
	errs = make([]error, len(batches))
	client := l.client
	if l.replayClient != nil {
		client = l.replayClient
	}
	type call struct {
		batch int
		units int64
		cmd   *redis.Cmd
	}
	var calls []call
	var now int64
	if l.now != nil {
		now = l.now().UnixMicro()
	}
	pipe, ok := client.(redis.Pipeliner)
	if !ok {
		c, isCmdable := client.(redis.Cmdable)
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
		s := replayScripts[b.Policy.Algorithm]
		key := l.keyOf(b.Policy, b.Identity)
		chunks := (len(b.Grants) + MaxReplayGrants - 1) / MaxReplayGrants
		for c := range chunks {
			grants := b.Grants[c*MaxReplayGrants : min(len(b.Grants), (c+1)*MaxReplayGrants)]
			marked := b
			if chunks > 1 {
				marked.Marker = b.Marker + "/" + strconv.Itoa(c)
			}
			args := make([]any, 0, 6+3*len(grants))
			args = append(args, now, b.Policy.Limit, b.Policy.WindowMicros(), b.Policy.Capacity(), MarkerTTL.Milliseconds(), len(grants))
			var units int64
			for _, g := range grants {
				args = append(args, g.At, g.Cost, g.ID)
				units += g.Cost
			}
			// EVALSHA in the pipeline; scripts are loaded first (below).
			calls = append(calls, call{batch: i, units: units,
				cmd: s.EvalSha(ctx, pipe, []string{key, l.MarkerKey(marked)}, args...)})
		}
	}
	if err := loadReplayScripts(ctx, client); err != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		pipe.Discard()
		return results, errs
	}
	if len(calls) > 0 {
		_, _ = pipe.Exec(ctx)
	}
	// A batch's calls are consecutive: fold their results into one.
	dup := make([]bool, len(batches))
	for i := range dup {
		dup[i] = true
	}
	for _, c := range calls {
		if errs[c.batch] != nil {
			continue
		}
		res, err := c.cmd.Slice()
		if err != nil {
			errs[c.batch] = classify(ctx, err)
			continue
		}
		r, err := parseReplay(res)
		if err != nil {
			errs[c.batch] = err
			continue
		}
		t := &results[c.batch]
		if r.Duplicate {
			t.DuplicateUnits += c.units
		} else {
			dup[c.batch] = false
			t.Replayed += r.Replayed
			t.Dropped += r.Dropped
			t.Present += r.Present
		}
	}
	for i := range results {
		if errs[i] == nil && len(batches[i].Grants) > 0 && dup[i] {
			results[i].Duplicate = true
		}
	}
	return results, errs
}

// loadReplayScripts makes sure the replay scripts are cached (on every node
// of a Cluster: SCRIPT LOAD is sent to all masters by go-redis).
func loadReplayScripts(ctx context.Context, client redis.Scripter) error {
	for _, s := range replayScripts {
		if err := s.Load(ctx, client).Err(); err != nil {
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
