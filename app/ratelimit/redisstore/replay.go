package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/reqid"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/statekey"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
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

// replayFoldLua is each algorithm's fold of one key, which the replay
// function of that algorithm runs for each key of the call (lua/replay.lua,
// library.go).
var replayFoldLua = map[ratelimit.Algorithm]string{
	ratelimit.TokenBucket:          replayTokenBucketLua,
	ratelimit.GCRA:                 replayGCRALua,
	ratelimit.SlidingWindowCounter: replayWindowCounterLua,
	ratelimit.SlidingWindowLog:     replayWindowLogLua,
}

// markerTTL is how long a replay's idempotency marker lives: longer than any
// retry of the same batch (a restart after a crash mid-replay included).
const markerTTL = time.Hour

// markerKey returns the idempotency marker of a batch: in the key's own
// slot, named by the batch's marker (instance and epoch) and the key.
func (l *Store) markerKey(b store.ReplayBatch) string {
	// The policy's every parameter: batches of one epoch under a policy
	// and under its reload (same state key) are two batches.
	return l.tag(b.Identity) + ":replay:" + b.Marker + ":" + b.Policy.Name + ":" + statekey.Params(b.Policy) + ":" + fmt.Sprintf("%x", b.Identity[:16])
}

// maxReplayGrants bounds the grants one replay script call folds in (each
// costs Redis a few µs of Lua), so no single call holds Redis for long and the other
// instances' decisions are served between calls. A batch with more (a hot
// key's whole outage) is sent as several parts, in order, each with a
// marker of its own.
const maxReplayGrants = 1000

// markerField splits a batch's marker ("<instance>:<epoch>[/part]") into
// the hash field that lists the instance's markers applied to a key and the
// token listed there.
func markerField(marker string) (field, token string) {
	i := strings.LastIndexByte(marker, ':')
	if i < 0 {
		return "m:" + marker, "1"
	}
	return "m:" + marker[:i], marker[i+1:]
}

// maxReplayKeys bounds the keys one replay script call carries.
const maxReplayKeys = 128

// replayPart is one batch's grants (or a maxReplayGrants slice of them)
// with the keys they go to.
type replayPart struct {
	batch       int
	state, mark string // the keys
	marker      string // the batch's (part's) marker
	policy      ratelimit.Policy
	grants      []store.Grant
	units       int64
}

// replayCall is one script call: parts of one algorithm and one hash tag.
type replayCall struct {
	parts  []replayPart
	grants int
	cmd    *redis.Cmd
}

// Replay folds journaled batches into Redis in one pipeline on the replay
// client. results[i] is valid where errs[i] is nil. The batches of one
// algorithm and hash tag (one Cluster slot) go in shared script calls of at
// most maxReplayKeys keys and maxReplayGrants grants, so a replay of many
// keys costs Redis one call per few dozen keys. A marker per batch (per
// part of a batch) makes each apply at most once: a batch already applied
// comes back with Duplicate set and changes nothing; a batch of which only
// some parts had been applied (a pipeline that failed part-way) applies the
// rest and reports the others' units as DuplicateUnits.
func (l *Store) Replay(ctx context.Context, batches []store.ReplayBatch) (results []store.ReplayResult, errs []error) {
	results = make([]store.ReplayResult, len(batches))
	errs = make([]error, len(batches))
	client := l.client
	if l.replayClient != nil {
		client = l.replayClient
	}
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
	type group struct {
		alg ratelimit.Algorithm
		tag string
	}
	// One Redis (a *redis.Client, Sentinel's included) runs a script over
	// keys of any slot; a Cluster or a Ring needs one slot per call.
	_, oneNode := client.(*redis.Client)
	open := map[group]*replayCall{}
	pids := map[ratelimit.Policy]string{}
	var calls []*replayCall
	for i, b := range batches {
		if err := b.Policy.Validate(); err != nil {
			errs[i] = err
			continue
		}
		algorithm.SortGrants(b.Grants)
		grp := group{alg: b.Policy.Algorithm}
		if !oneNode {
			grp.tag = l.tag(b.Identity)
		}
		pid, ok := pids[b.Policy]
		if !ok {
			pid = fingerprint(b.Policy)
			pids[b.Policy] = pid
		}
		state := l.keyWith(pid, b.Identity)
		parts := (len(b.Grants) + maxReplayGrants - 1) / maxReplayGrants
		for p := range parts {
			grants := b.Grants[p*maxReplayGrants : min(len(b.Grants), (p+1)*maxReplayGrants)]
			marked := b
			if parts > 1 {
				marked.Marker = b.Marker + "/" + strconv.Itoa(p)
			}
			// The window counter keeps its marker in a field of its hash;
			// the others', in a key of its own.
			mark := state
			if b.Policy.Algorithm != ratelimit.SlidingWindowCounter {
				mark = l.markerKey(marked)
			}
			part := replayPart{batch: i, state: state, mark: mark, marker: marked.Marker, policy: b.Policy, grants: grants}
			for _, g := range grants {
				part.units += g.Cost
			}
			c := open[grp]
			if c == nil || len(c.parts) == maxReplayKeys || c.grants+len(grants) > maxReplayGrants {
				c = &replayCall{}
				open[grp] = c
				calls = append(calls, c)
			}
			c.parts = append(c.parts, part)
			c.grants += len(grants)
		}
	}
	for _, c := range calls {
		keys := make([]string, 0, 3*len(c.parts))
		args := make([]any, 0, 3+7*len(c.parts)+3*c.grants)
		args = append(args, now, markerTTL.Milliseconds(), len(c.parts))
		for _, p := range c.parts {
			keys = append(keys, p.state, p.mark, fenceKey(p.state))
			field, token := markerField(p.marker)
			args = append(args, p.policy.Limit, p.policy.Window.Microseconds(), p.policy.Capacity(), field, token,
				batches[p.batch].ResetsRead, len(p.grants))
			for _, g := range p.grants {
				args = append(args, g.At, g.Cost, reqid.Short(g.ID))
			}
		}
		// FCALL in the pipeline; the library is loaded first (below).
		c.cmd = pipe.FCall(ctx, fnReplay[c.parts[0].policy.Algorithm], keys, args...)
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
	// Fold each batch's parts into one result.
	dup := make([]bool, len(batches))
	for i := range dup {
		dup[i] = true
	}
	for _, c := range calls {
		res, err := c.cmd.Slice()
		if err == nil && len(res) != 4*len(c.parts) {
			err = fmt.Errorf("%w: replay reply of %d elements for %d batches", ratelimit.ErrBadReply, len(res), len(c.parts))
		}
		for j, p := range c.parts {
			if errs[p.batch] != nil {
				continue
			}
			if err != nil {
				errs[p.batch] = classify(ctx, err)
				continue
			}
			r, err := parseReplay(res[4*j : 4*j+4])
			if err != nil {
				errs[p.batch] = err
				continue
			}
			t := &results[p.batch]
			if r.fenced {
				errs[p.batch] = contract.ErrFenced
				continue
			}
			if r.Duplicate {
				t.DuplicateUnits += p.units
			} else {
				dup[p.batch] = false
				t.Replayed += r.Replayed
				t.Dropped += r.Dropped
				t.Present += r.Present
			}
		}
	}
	for i := range results {
		if errs[i] == nil && len(batches[i].Grants) > 0 && dup[i] {
			results[i].Duplicate = true
		}
	}
	return results, errs
}

// loadReplayScripts makes sure the library is loaded, on every master of
// a Cluster (loadLibrary).
func loadReplayScripts(ctx context.Context, client redis.ScriptingFunctionsCmdable) error {
	if err := loadLibrary(ctx, client); err != nil {
		return classify(ctx, err)
	}
	return nil
}

// replayReply is one batch's part of a replay reply.
type replayReply struct {
	store.ReplayResult
	fenced bool // the key was reset after the sender's last read of the log
}

func parseReplay(res []any) (replayReply, error) {
	if len(res) != 4 {
		return replayReply{}, fmt.Errorf("%w: replay reply of %d elements", ratelimit.ErrBadReply, len(res))
	}
	var v [4]int64
	for i, x := range res {
		n, ok := x.(int64)
		if !ok || n < 0 || i == 3 && n > 2 {
			return replayReply{}, fmt.Errorf("%w: replay reply %v", ratelimit.ErrBadReply, res)
		}
		v[i] = n
	}
	return replayReply{store.ReplayResult{Replayed: v[0], Dropped: v[1], Present: v[2], Duplicate: v[3] == 1}, v[3] == 2}, nil
}
