// Package redisstore is the Redis backend: every decision is one atomic Lua
// function call (FCALL of a function of this release's library, loaded
// again when a node lacks it, library.go) that takes its time from Redis'
// TIME, so instances sharing a Redis never disagree about the clock and
// never read-then-write from Go. It needs Redis 7.0 or later (functions).
//
// Keys: every key of one identity shares a hash tag "{<prefix>:XX}" chosen
// by hashing the identity into 1024 buckets, so a script touches one Cluster
// slot, no client can choose the slot by sending "{...}", and key length is
// fixed whatever the client sends.
package redisstore

// This file: the store and its options, key naming, the script call and the
// parsing of its reply. Fleet heartbeats, replay, pipelines and Cluster
// shards have their own files.

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/reqid"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/shortname"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// tagBuckets is the number of hash tags identities are spread over.
const tagBuckets = 1024

var (
	//go:embed lua/arith.lua
	arithLua string
	//go:embed lua/fill.lua
	fillLua string
	//go:embed lua/counter.lua
	counterLua string
	//go:embed lua/common.lua
	commonLua string
	//go:embed lua/decide.lua
	decideLua string
	//go:embed lua/once.lua
	onceLua string
	//go:embed lua/token_bucket.lua
	tokenBucketLua string
	//go:embed lua/gcra.lua
	gcraLua string
	//go:embed lua/state.lua
	stateLua string
	//go:embed lua/sliding_window_counter.lua
	windowCounterLua string
	//go:embed lua/sliding_window_log.lua
	windowLogLua string
)

// algorithmLua is each algorithm's decision body, a function of the
// library (library.go) that its single and batch functions call.
// helpersLua is every helper, for the replay and repair functions.
// decideSrc is the decision of each algorithm as an EVAL script, and
// scripts the same as go-redis scripts: the store calls the library, and
// these serve only the benchmarks that compare the two
// (BenchmarkScriptParts). A decision script holds only the helpers its
// algorithm calls: Redis runs the whole script on every call, and each
// helper defined is a closure made and collected per decision. The
// algorithm's body follows its helpers and the call of args
// (lua/decide.lua) that reads the request from KEYS and ARGV.
var (
	algorithmLua = map[ratelimit.Algorithm]string{
		ratelimit.TokenBucket:          tokenBucketLua,
		ratelimit.GCRA:                 gcraLua,
		ratelimit.SlidingWindowCounter: windowCounterLua,
		ratelimit.SlidingWindowLog:     windowLogLua,
	}
	decideSrc = map[ratelimit.Algorithm]string{
		ratelimit.TokenBucket:          arithLua + fillLua + stateLua + decideLua + onceLua + argsLua + tokenBucketLua,
		ratelimit.GCRA:                 arithLua + stateLua + decideLua + onceLua + argsLua + gcraLua,
		ratelimit.SlidingWindowCounter: arithLua + counterLua + decideLua + onceLua + argsLua + windowCounterLua,
		ratelimit.SlidingWindowLog:     arithLua + decideLua + argsLua + windowLogLua,
	}
	helpersLua = arithLua + fillLua + counterLua + commonLua + stateLua
	scripts    = newScripts(decideSrc)
)

// argsLua sets a decision script's request from its key and arguments.
const argsLua = "args(KEYS[1], ARGV)\n"

func newScripts(src map[ratelimit.Algorithm]string) map[ratelimit.Algorithm]*redis.Script {
	out := make(map[ratelimit.Algorithm]*redis.Script, len(src))
	for a, s := range src {
		out[a] = redis.NewScript(s)
	}
	return out
}

// Store is a ratelimit.Limiter backed by Redis, and the store.Store that
// resilient.New wraps. It is safe for concurrent use. Use New.
type Store struct {
	client redis.ScriptingFunctionsCmdable
	// replayClient carries replays and restores (default: client). Its
	// own timeouts let a pipeline of thousands of batches take longer
	// than one decision may.
	replayClient redis.ScriptingFunctionsCmdable
	prefix       string
	timeout      time.Duration
	resend       int64 // the resend window, µs (Config.ResendWindow)
	onDecision   func(req ratelimit.Request, d ratelimit.Decision, latency time.Duration)
	onError      func(req ratelimit.Request, err error, latency time.Duration)
	now          func() time.Time // tests only; nil: Redis TIME
	ids          *reqid.Minter    // for requests without an id
	// beatOffset is Redis' clock minus this host's, µs, learned from the
	// fleet script's replies (beatDeadline); beatOffsetKnown once one came.
	beatOffset      atomic.Int64
	beatOffsetKnown atomic.Bool
	co              *coalescer // nil: every call its own round trip
	// lingering is how many heartbeats and pings are reading their
	// replies past their callers' deadlines (linger.go).
	lingering atomic.Int32
	// perSlot: a single client's server refused a batch of several hash
	// slots (a one-node Cluster); batches hold one slot since (batch.go).
	perSlot atomic.Bool
	shards  shardLayout // a Cluster's slot ranges (shards.go)
	seen    seenWrites  // the write counters last seen (lost.go)
}

var _ ratelimit.Limiter = (*Store)(nil)

// Config configures a Store. The zero Config is the default.
type Config struct {
	// Prefix is the key prefix inside the hash tag (default "rl").
	Prefix string
	// Timeout bounds each decision's round trip (default: none beyond the
	// caller's context and the client's own timeouts).
	Timeout time.Duration
	// Coalescing makes concurrent decisions share pipelines, so that many
	// callers cost Redis a few round trips instead of one each. A call that
	// finds fewer than Coalescing pipelines in flight sends at once, taking
	// along whatever calls are queued: a lone caller waits for nothing.
	// Otherwise it queues, and the next pipeline to finish sends the whole
	// queue. Each call keeps its own deadline (a call whose context ended
	// before its pipeline left is not sent; one that ends while its
	// pipeline is out returns then, and the pipeline goes on for the
	// others) and gets the answers it would get alone. 0 (the default)
	// turns coalescing off: one round trip per call. A pipeline's requests
	// go as one batch script call per Redis node (batch.go); on a Cluster,
	// one per hash slot, and go-redis splits the pipeline per node. It
	// needs a client that pipelines (redis.Cmdable).
	//
	// When Redis is slow, waiting for a pipeline to come back before
	// sending costs each call a second round trip: a call that finds every
	// pipeline in flight, the latest of them sent more than a tenth of
	// Timeout ago (at least 2 ms), sends one more, up to 16 × Coalescing
	// (TestSlowPipelinesDoNotQueue).
	Coalescing int
	// ReplayClient carries replays (Replay) instead of the decisions'
	// client. go-redis bounds every socket read by the client's
	// ReadTimeout whatever the context allows, and a pipeline that
	// outlives it fails as a whole, so a client tuned for 50 ms decisions
	// cannot carry a replay of thousands of keys: give replays a client
	// whose timeouts are the replay budget (see ClientConfig.Timeout).
	ReplayClient redis.ScriptingFunctionsCmdable
	// ResendWindow is how long after a request was admitted a request
	// with the same ratelimit.Request.ID is taken for a resend of it (a
	// proxy trying another instance after the first failed, possibly
	// after deciding it): admitted without being counted again (default
	// 3 s). For the token bucket, GCRA and the window counter only the
	// key's last admission is recognised (lua/once.lua); for the sliding
	// window log, any admission of the id within the window. Set it to the
	// retry window of the proxy in front: longer only lengthens what a
	// client that picks its own ids (a misconfigured proxy passing them
	// through) gets for free.
	ResendWindow time.Duration
	// OnDecision, when set, is called after every decision Redis made,
	// with the round trip's latency; OnError after every failed call.
	// They observe decisions without the package importing a metrics
	// library, and must be safe for concurrent use and fast.
	OnDecision func(req ratelimit.Request, d ratelimit.Decision, latency time.Duration)
	OnError    func(req ratelimit.Request, err error, latency time.Duration)
	// Clock makes the scripts use Clock() instead of Redis TIME. For tests
	// only: in production the time must come from Redis, or instances
	// with skewed clocks would disagree.
	Clock func() time.Time
}

// defaultResendWindow is Config.ResendWindow when none is given. A proxy
// resends a request only within a bounded time of its first attempt:
// nginx, within proxy_next_upstream_timeout of the start of that attempt
// (2 s in nginx/nginx.conf.template). The first attempt's admission came
// after that start, and the resend's decision takes at most the resend's
// connect and one decision's timeout (well under a second), so 3 s covers
// every resend nginx makes, and an id repeated later counts again.
const defaultResendWindow = 3 * time.Second

// New returns a Store using client, which may be a *redis.Client,
// *redis.ClusterClient, *redis.Ring or any redis.UniversalClient.
func New(client redis.ScriptingFunctionsCmdable, cfg Config) *Store {
	l := &Store{
		client:       client,
		replayClient: cfg.ReplayClient,
		prefix:       cmp.Or(cfg.Prefix, "rl"),
		timeout:      cfg.Timeout,
		resend:       defaultResendWindow.Microseconds(),
		onDecision:   cfg.OnDecision,
		onError:      cfg.OnError,
		now:          cfg.Clock,
		ids:          reqid.New(""),
	}
	if cfg.ResendWindow > 0 {
		l.resend = cfg.ResendWindow.Microseconds()
	}
	if _, ok := client.(redis.Cmdable); ok && cfg.Coalescing > 0 {
		l.co = &coalescer{max: cfg.Coalescing, send: l.pipeline, timeout: l.timeout}
	}
	return l
}

// The key of an identity's state under a policy is
//
//	{<prefix>:<tag>}<policy id><identity>
//
// 28 bytes with the prefix "rl", short enough that Redis keeps its name
// in its smallest allocation (MEMORY USAGE, the memory/* rows of make
// bench):
//   - tag: one of tagBuckets hash tags (two base64url characters) chosen
//     from the identity's hash, so that an identity's keys under every
//     policy share a Cluster slot (one script resets them all) and a
//     pipeline's keys fall into few slots (one batch call each);
//   - policy id: the policy's fingerprint (fingerprint, seven
//     characters), so that a policy whose algorithm or window changes
//     starts afresh;
//   - identity: 14 base64url characters (84 bits) of its hash.
const (
	policyIDLen = 7
	identityLen = 14
)

// tag is the identity's hash tag, "{<prefix>:<two characters>}".
func (l *Store) tag(sum store.Identity) string {
	return string(l.appendTag(make([]byte, 0, len(l.prefix)+5), sum))
}

func (l *Store) appendTag(b []byte, sum store.Identity) []byte {
	n := binary.BigEndian.Uint16(sum[16:18]) % tagBuckets
	b = append(append(append(b, '{'), l.prefix...), ':')
	return append(b, shortname.Alphabet[n>>6], shortname.Alphabet[n&63], '}')
}

// Key returns the Redis key holding policy p's state for identity (see
// policyIDLen).
func (l *Store) Key(p ratelimit.Policy, identity string) string {
	return l.keyOf(p, store.IdentityOf(identity))
}

func (l *Store) keyOf(p ratelimit.Policy, id store.Identity) string {
	return l.keyWith(fingerprint(p), id)
}

// fingerprint names the stored state of policy p: seven base64url
// characters (42 bits) of the FNV-1a hash of its name, algorithm and
// window. It is part of every key: a policy reloaded with another
// algorithm or window starts every key afresh, and one reloaded with
// another limit or burst keeps each key's usage (the token bucket its
// tokens, clamped to the new capacity; GCRA its theoretical arrival time,
// the time until the key is full again; the window algorithms their grants
// and counts, judged against the new limit).
func fingerprint(p ratelimit.Policy) string {
	return shortname.Of(policyIDLen, p.Name, string(p.Algorithm), strconv.FormatInt(p.Window.Microseconds(), 10))
}

// keyWith is keyOf with the policy's fingerprint computed.
func (l *Store) keyWith(pid string, id store.Identity) string {
	b := make([]byte, 0, len(l.prefix)+5+policyIDLen+identityLen+2) // +2: the encoding's tail, cut
	b = l.appendTag(b, id)
	b = append(b, pid...)
	// The first 84 bits: 14 of the 16 characters of its first 12 bytes.
	b = base64.RawURLEncoding.AppendEncode(b, id[:12])
	b = b[:len(b)-2]
	return string(b)
}

// Decide makes one decision in one round trip (with Config.Coalescing, in a
// pipeline shared with the concurrent calls).
func (l *Store) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	d, err := l.decide(ctx, contract.Request{Request: req})
	return d.Decision, err
}

// decide is Decide with the request's weight and hold, and the state in
// the decision (the extension's DecideWire).
func (l *Store) decide(ctx context.Context, req contract.Request) (contract.Decision, error) {
	if l.co != nil {
		ds, errs := l.decideBatch(ctx, []contract.Request{req})
		return ds[0], errs[0]
	}
	if err := req.Validate(); err != nil {
		return contract.Decision{}, err
	}
	if req.ID == "" {
		req.ID = l.ids.Next()
	}
	callCtx, cancel := l.callContext(ctx)
	defer cancel()
	return l.decideOne(callCtx, req)
}

// decideOne sends one valid request (with an ID) as a single FCALL (the
// library loaded and the call sent again when the node lacks it), within
// ctx.
func (l *Store) decideOne(ctx context.Context, req contract.Request) (contract.Decision, error) {
	callCtx := ctx
	var now int64
	if l.now != nil {
		now = l.now().UnixMicro()
	}
	p := req.Policy
	start := time.Now()
	res, err := fcall(callCtx, l.client, fnDecide[p.Algorithm], []string{l.Key(p, req.Key)}, l.scriptArgs(req, now)...).Slice()
	latency := time.Since(start)
	var d contract.Decision
	if err == nil {
		d, err = parseReply(p.Algorithm, res)
	}
	if err != nil {
		err = classify(ctx, err)
		if l.onError != nil {
			l.onError(req.Request, err, latency)
		}
		return contract.Decision{}, err
	}
	d.Limit = p.Capacity()
	d.Mode = ratelimit.ModeRedis
	if l.onDecision != nil {
		l.onDecision(req.Request, d.Decision, latency)
	}
	return d, nil
}

// scriptArgs are the ARGV of req's decision script (lua/decide.lua); the
// hold only when there is one.
func (l *Store) scriptArgs(req contract.Request, now int64) []any {
	p := req.Policy
	args := []any{now, p.Limit, p.Window.Microseconds(), p.Capacity(), req.Units(), scriptID(req), req.Weight.Num, req.Weight.Den, l.resend}
	if req.Hold > 0 {
		args = append(args, req.Hold.Microseconds())
	}
	return args
}

// scriptID is the request id a decision script gets, in the short form
// Redis keeps (reqid.Short; so are a refusal's contract.Decision.ResendID and a
// replayed grant's id): none for a read-only request, which must not be
// remembered as admitted (lua/once.lua) nor become a member of a sliding
// window log.
func scriptID(r contract.Request) string {
	if r.ReadOnly {
		return ""
	}
	return reqid.Short(r.ID)
}

// DecideBatch decides several requests in one round trip: one pipeline (on
// a Cluster, one per node) holding one FCALL of the batch function for the
// requests of each node (each hash slot on a Cluster), which decides them
// in order (batch.go, TestBatchDecidesAsOneByOne). Each request's decision and
// error are what Decide would return for it. When a node lacks the library (after a restart or a FUNCTION FLUSH), it is
// loaded and only the calls that failed for it are sent again, so nothing
// is counted twice.
func (l *Store) DecideBatch(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, []error) {
	wreqs := make([]contract.Request, len(reqs))
	for i, r := range reqs {
		wreqs[i].Request = r
	}
	ds, errs := l.decideBatch(ctx, wreqs)
	return contract.Plain(ds), errs
}

// decideBatch is DecideBatch with the requests' weights and holds, and the
// states in the decisions (the extension's DecideWire).
func (l *Store) decideBatch(ctx context.Context, reqs []contract.Request) ([]contract.Decision, []error) {
	ds, errs := make([]contract.Decision, len(reqs)), make([]error, len(reqs))
	_, pipelines := l.client.(redis.Cmdable)
	if !pipelines || (len(reqs) == 1 && l.co == nil) {
		for i, r := range reqs {
			ds[i], errs[i] = l.decide(ctx, r)
		}
		return ds, errs
	}
	valid := make([]contract.Request, 0, len(reqs))
	at := make([]int, 0, len(reqs))
	for i, r := range reqs {
		if errs[i] = r.Validate(); errs[i] != nil {
			continue
		}
		if r.ID == "" {
			r.ID = l.ids.Next()
		}
		valid, at = append(valid, r), append(at, i)
	}
	if len(valid) == 0 {
		return ds, errs
	}
	var vds []contract.Decision
	var verrs []error
	if l.co != nil {
		vds, verrs = l.co.do(ctx, valid)
	} else {
		callCtx, cancel := l.callContext(ctx)
		vds, verrs = l.pipeline(callCtx, valid)
		cancel()
	}
	for j, i := range at {
		ds[i], errs[i] = vds[j], verrs[j]
		if err := ctx.Err(); errs[i] != nil && err != nil && !errors.Is(errs[i], err) {
			errs[i] = fmt.Errorf("redisstore: %w: %w", err, errs[i])
		}
	}
	return ds, errs
}
