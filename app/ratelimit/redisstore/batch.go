package redisstore

// Pipelines of decisions: the requests a pipeline carries for one Redis
// node (on a Cluster, one hash slot) go as one call of the batch script,
// which decides them all in order, instead of one script call each.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

//go:embed lua/batch.lua
var batchLua string

// batchCodes numbers the algorithms for the batch script's arguments
// (lua/batch.lua): decide_<code> is that algorithm's body.
var batchCodes = map[ratelimit.Algorithm]int{
	ratelimit.TokenBucket:          1,
	ratelimit.GCRA:                 2,
	ratelimit.SlidingWindowCounter: 3,
	ratelimit.SlidingWindowLog:     4,
}

// maxBatch bounds the requests of one batch script call, so that one call
// holds Redis for a bounded time; a larger group goes as several calls in
// the same pipeline.
const maxBatch = 64

// batchArgs is the number of batch script arguments per request.
const batchArgs = 9

// scriptCall is one function call of a pipeline: the requests it decides
// (indices into the pipeline's requests), the function, and its command
// once sent.
type scriptCall struct {
	at   []int
	fn   string
	keys []string
	args []any
	cmd  *redis.Cmd
}

// groupOf returns, for a request's key, the group of requests one batch
// script may decide with it: all of them on a single Redis, the key's hash
// slot on a Cluster (and on a single client whose server refused keys of
// several slots in one call: a one-node Cluster, l.perSlot), and its hash
// tag on any other client (a Ring shards by tag).
func (l *Store) groupOf() func(key string) int {
	switch l.client.(type) {
	case *redis.Client:
		if !l.perSlot.Load() {
			return func(string) int { return 0 }
		}
		return func(key string) int { return slot(hashTag(key)) }
	case *redis.ClusterClient:
		return func(key string) int { return slot(hashTag(key)) }
	}
	tags := map[string]int{}
	return func(key string) int {
		t := hashTag(key)
		n, ok := tags[t]
		if !ok {
			n = len(tags)
			tags[t] = n
		}
		return n
	}
}

// hashTag is the content of key's hash tag: what is between the first
// "{" and the "}" after it (the whole key when there is none, as Redis
// does).
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// scriptCalls groups the valid requests (with IDs) reqs[i] for i in which
// into script calls: a group of one request is its algorithm's own script,
// a larger one the batch script (in calls of at most maxBatch), each in the
// requests' order.
func (l *Store) scriptCalls(reqs []contract.Request, which []int, now int64) []*scriptCall {
	keys := make([]string, len(reqs))
	groups := map[int][]int{}
	var order []int
	group := l.groupOf()
	for _, i := range which {
		r := reqs[i]
		keys[i] = l.Key(r.Policy, r.Key)
		g := group(keys[i])
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], i)
	}
	var calls []*scriptCall
	for _, g := range order {
		for at := range slices.Chunk(groups[g], maxBatch) {
			if len(at) == 1 {
				r := reqs[at[0]]
				p := r.Policy
				calls = append(calls, &scriptCall{at: at, fn: fnDecide[p.Algorithm], keys: []string{keys[at[0]]},
					args: l.scriptArgs(r, now)})
				continue
			}
			c := &scriptCall{at: at, fn: fnBatch, keys: make([]string, 0, len(at)), args: make([]any, 0, 2+batchArgs*len(at))}
			c.args = append(c.args, now, l.resend)
			for _, i := range at {
				r := reqs[i]
				p := r.Policy
				c.keys = append(c.keys, keys[i])
				c.args = append(c.args, batchCodes[p.Algorithm], p.Limit, p.Window.Microseconds(), p.Capacity(), r.Units(), scriptID(r), r.Weight.Num, r.Weight.Den, r.Hold.Microseconds())
			}
			calls = append(calls, c)
		}
	}
	return calls
}

// pipeline sends valid requests (with IDs) in one pipeline (on a Cluster,
// one per node): the requests of one node, or one slot, as one call of the
// batch function (scriptCalls). When a node lacks the library (after a
// restart or a FUNCTION FLUSH), it is loaded and only the calls that
// failed for it are sent again, so nothing is counted twice.
func (l *Store) pipeline(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	ds, errs := make([]contract.Decision, len(reqs)), make([]error, len(reqs))
	if len(reqs) == 1 { // a lone call: a plain command costs less than a pipeline
		ds[0], errs[0] = l.decideOne(ctx, reqs[0])
		return ds, errs
	}
	pl := l.client.(redis.Cmdable)
	var now int64
	if l.now != nil {
		now = l.now().UnixMicro()
	}
	all := make([]int, len(reqs))
	for i := range all {
		all[i] = i
	}
	calls := l.scriptCalls(reqs, all, now)
	_, single := l.client.(*redis.Client)
	// The library is loaded only where a call found it missing (below):
	// a load where it is (Ping loads it at start and after an outage)
	// would cost Redis little, but its "already exists" error reply would
	// mark each traced pipeline failed.
	send := func(which []*scriptCall, load bool) {
		pipe := pl.Pipeline()
		if load {
			pipe.FunctionLoad(ctx, librarySrc)
		}
		for _, c := range which {
			c.cmd = pipe.FCall(ctx, c.fn, c.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx)
	}
	start := time.Now()
	send(calls, false)
	// CROSSSLOT: a server in Cluster mode behind a single client (a
	// one-node Cluster) refused a batch of several slots before running
	// it; its requests go again grouped per slot, as every later pipeline
	// of this store (TestBatchOnOneClusterNode).
	var refused []int
	kept := calls[:0:0]
	for _, c := range calls {
		if c.fn == fnBatch && c.cmd.Err() != nil && redis.HasErrorPrefix(c.cmd.Err(), "CROSSSLOT") {
			refused = append(refused, c.at...)
			continue
		}
		kept = append(kept, c)
	}
	if len(refused) > 0 {
		l.perSlot.Store(true)
		retry := l.scriptCalls(reqs, refused, now)
		send(retry, false)
		calls = append(kept, retry...)
	}
	// Function not found: the node lacks the library (a restart without
	// persistence, a FUNCTION FLUSH, a failover to a replica that never
	// had it) and the call never ran, so sending it again counts it once.
	// The library is loaded once, however many calls of the pipeline
	// needed it (after a restart, all of them do). On a single Redis the
	// load leads the pipeline that sends the calls again, which the server
	// runs in order: one round trip for both.
	var again []*scriptCall
	for _, c := range calls {
		if functionMissing(c.cmd.Err()) {
			again = append(again, c)
		}
	}
	if len(again) > 0 {
		if single {
			send(again, true)
		} else if loadLibrary(ctx, l.client) == nil {
			send(again, false)
		}
	}
	latency := time.Since(start)
	for _, c := range calls {
		for n, i := range c.at {
			req := reqs[i]
			d, err := c.reply(n, req.Policy.Algorithm)
			if err != nil {
				errs[i] = classify(ctx, err)
				if l.onError != nil {
					l.onError(req.Request, errs[i], latency)
				}
				continue
			}
			d.Limit = req.Policy.Capacity()
			d.Mode = ratelimit.ModeRedis
			ds[i] = d
			if l.onDecision != nil {
				l.onDecision(req.Request, d.Decision, latency)
			}
		}
	}
	return ds, errs
}

// reply is the decision of the call's n-th request (of algorithm a), or
// its error: the call's own, or, from the batch script, the request's.
func (c *scriptCall) reply(n int, a ratelimit.Algorithm) (contract.Decision, error) {
	res, err := c.cmd.Slice()
	if err != nil {
		return contract.Decision{}, err
	}
	if c.fn != fnBatch {
		return parseReply(a, res)
	}
	if len(res) != len(c.at) {
		return contract.Decision{}, fmt.Errorf("%w: batch of %d replies, want %d", ratelimit.ErrBadReply, len(res), len(c.at))
	}
	switch x := res[n].(type) {
	case []any:
		return parseReply(a, x)
	case error:
		var rerr redis.Error
		if errors.As(x, &rerr) {
			return contract.Decision{}, rerr
		}
		return contract.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrBadReply, x)
	}
	return contract.Decision{}, fmt.Errorf("%w: batch reply %d is %T, want an array", ratelimit.ErrBadReply, n, res[n])
}
