package redisstore

// Pipelines of decisions: the requests a pipeline carries for one Redis
// node (on a Cluster, one hash slot) go as one call of the batch script,
// which decides them all in order, instead of one script call each.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
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

// batchSrc is the batch script: every helper once, each algorithm's body
// (the same file its own decision script runs) as a function, then the loop
// of lua/batch.lua. The helpers and functions are made once per call, not
// once per decision.
var batchSrc = func() string {
	var b strings.Builder
	b.WriteString(arithLua + fillLua + counterLua + stateLua + decideLua + onceLua)
	for _, a := range ratelimit.Algorithms {
		fmt.Fprintf(&b, "local function decide_%d()\n%s\nend\n", batchCodes[a], algorithmLua[a])
	}
	b.WriteString(batchLua)
	return b.String()
}()

var (
	batchScript = redis.NewScript(batchSrc)
	// decideSrcs are the scripts a decision may need, which Ping loads.
	decideSrcs = append(slices.Collect(maps.Values(decideSrc)), batchSrc)
	// sourceOf is the source of each decision script.
	sourceOf = func() map[*redis.Script]string {
		m := map[*redis.Script]string{batchScript: batchSrc}
		for a, s := range scripts {
			m[s] = decideSrc[a]
		}
		return m
	}()
)

// maxBatch bounds the requests of one batch script call, so that one call
// holds Redis for a bounded time; a larger group goes as several calls in
// the same pipeline.
const maxBatch = 64

// batchArgs is the number of batch script arguments per request.
const batchArgs = 9

// scriptCall is one script call of a pipeline: the requests it decides
// (indices into the pipeline's requests), and its command once sent.
type scriptCall struct {
	at     []int
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
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
func (l *Store) scriptCalls(reqs []ratelimit.Request, which []int, now int64) []*scriptCall {
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
				calls = append(calls, &scriptCall{at: at, script: scripts[p.Algorithm], keys: []string{keys[at[0]]},
					args: l.scriptArgs(r, now)})
				continue
			}
			c := &scriptCall{at: at, script: batchScript, keys: make([]string, 0, len(at)), args: make([]any, 0, 3+batchArgs*len(at))}
			c.args = append(c.args, now, l.resend, hashFlag(l.hashState))
			for _, i := range at {
				r := reqs[i]
				p := r.Policy
				c.keys = append(c.keys, keys[i])
				c.args = append(c.args, batchCodes[p.Algorithm], p.Limit, p.WindowMicros(), p.Capacity(), r.Units(), scriptID(r), r.Weight.Num, r.Weight.Den, r.Hold.Microseconds())
			}
			calls = append(calls, c)
		}
	}
	return calls
}

// pipeline sends valid requests (with IDs) in one pipeline (on a Cluster,
// one per node): the requests of one node, or one slot, as one call of the
// batch script (scriptCalls). A script Redis does not have cached (after a
// restart or a SCRIPT FLUSH) is loaded and only the calls that failed for
// it are sent again, so nothing is counted twice.
func (l *Store) pipeline(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, []error) {
	ds, errs := make([]ratelimit.Decision, len(reqs)), make([]error, len(reqs))
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
	// A single Redis' first batch call carries the script (EVAL), which
	// the calls after it in the pipeline then find cached: the batch
	// script is not loaded with the algorithms' scripts a lone decision
	// loads, and a NOSCRIPT would cost the pipeline a second round trip.
	eval := single && !l.batchLoaded.Load()
	send := func(which []*scriptCall, load []*redis.Script) {
		pipe := pl.Pipeline()
		for _, s := range load {
			pipe.ScriptLoad(ctx, sourceOf[s])
		}
		for _, c := range which {
			if eval && c.script == batchScript {
				c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
				eval = false
				continue
			}
			c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx)
	}
	start := time.Now()
	send(calls, nil)
	// CROSSSLOT: a server in Cluster mode behind a single client (a
	// one-node Cluster) refused a batch of several slots before running
	// it; its requests go again grouped per slot, as every later pipeline
	// of this store (TestBatchOnOneClusterNode).
	var refused []int
	kept := calls[:0:0]
	for _, c := range calls {
		if c.script == batchScript && c.cmd.Err() != nil && redis.HasErrorPrefix(c.cmd.Err(), "CROSSSLOT") {
			refused = append(refused, c.at...)
			continue
		}
		kept = append(kept, c)
	}
	if len(refused) > 0 {
		l.perSlot.Store(true)
		retry := l.scriptCalls(reqs, refused, now)
		eval = !l.batchLoaded.Load() // a refused call was not run, nor cached
		send(retry, nil)
		calls = append(kept, retry...)
	}
	// NOSCRIPT: the script never ran, so sending the call again counts it
	// once. Each missing script is loaded once, however many calls of the
	// pipeline needed it (after a Redis restart, all of them do: a load per
	// call, one round trip each, held a shared pipeline for hundreds of ms).
	// On a single Redis the loads lead the pipeline that sends the calls
	// again, which the server runs in order: one round trip for both.
	var again []*scriptCall
	var missing []*redis.Script
	loaded := map[*redis.Script]bool{}
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			ok, tried := loaded[c.script]
			if !tried {
				if single {
					missing, ok = append(missing, c.script), true
				} else {
					ok = c.script.Load(ctx, l.client).Err() == nil
				}
				loaded[c.script] = ok
			}
			if ok {
				again = append(again, c)
			}
		}
	}
	if len(again) > 0 {
		send(again, missing)
	}
	for _, c := range calls {
		if c.script == batchScript && c.cmd.Err() == nil {
			l.batchLoaded.Store(true)
			break
		}
	}
	latency := time.Since(start)
	for _, c := range calls {
		for n, i := range c.at {
			req := reqs[i]
			d, err := c.reply(n, req.Policy.Algorithm)
			if err != nil {
				errs[i] = classify(ctx, err)
				if l.hooks.OnError != nil {
					l.hooks.OnError(req, errs[i], latency)
				}
				continue
			}
			d.Limit = req.Policy.Capacity()
			d.Mode = ratelimit.ModeRedis
			ds[i] = d
			if l.hooks.OnDecision != nil {
				l.hooks.OnDecision(req, d, latency)
			}
		}
	}
	return ds, errs
}

// reply is the decision of the call's n-th request (of algorithm a), or
// its error: the call's own, or, from the batch script, the request's.
func (c *scriptCall) reply(n int, a ratelimit.Algorithm) (ratelimit.Decision, error) {
	res, err := c.cmd.Slice()
	if err != nil {
		return ratelimit.Decision{}, err
	}
	if c.script != batchScript {
		return parseReply(a, res)
	}
	if len(res) != len(c.at) {
		return ratelimit.Decision{}, fmt.Errorf("%w: batch of %d replies, want %d", ratelimit.ErrBadReply, len(res), len(c.at))
	}
	switch x := res[n].(type) {
	case []any:
		return parseReply(a, x)
	case error:
		var rerr redis.Error
		if errors.As(x, &rerr) {
			return ratelimit.Decision{}, rerr
		}
		return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrBadReply, x)
	}
	return ratelimit.Decision{}, fmt.Errorf("%w: batch reply %d is %T, want an array", ratelimit.ErrBadReply, n, res[n])
}
