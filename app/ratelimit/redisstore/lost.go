package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// Lost writes. A Redis that restarts empty gets a new data generation (the
// generation key is gone), which the fleet notices. A replica promoted while
// behind its master, or an AOF that lost its last second, keeps the
// generation but forgets the most recent writes: usage the instances were
// told of, silently erased.
//
// To notice it, every heartbeat (and every generation check) increments a
// write counter beside the generation key, in the same shard, and each
// instance remembers the highest value it was answered. Redis only ever
// answers a higher value than any it answered before, unless it lost that
// write: a counter that does not go up under the same generation is lost
// writes. The instance that sees it replaces the generation (compare and
// set, so one new generation however many notice) with one marked "lag-",
// and every instance, seeing the generation change, raises its keys to the
// floors its replies showed (Raise) instead of adding the usage back as
// after a wipe (Loss says which). Writes lost within one heartbeat interval
// of the fleet's last counter increment are not noticed: the counter
// reached the replica after them.

//go:embed lua/raise.lua
var raiseLua string

// lagLua replaces the generation ARGV[1] with ARGV[2]; a generation that
// changed meanwhile is kept (another instance noticed first, or the data is
// gone altogether). Reply: the generation now.
const lagLua = `local g = redis.call('GET', KEYS[1])
if g == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return ARGV[2]
end
if not g then
  redis.call('SET', KEYS[1], ARGV[3])
  return ARGV[3]
end
return g`

// lagPrefix marks a generation that replaced one whose shard lost only its
// recent writes.
const lagPrefix = "lag-"

// seenWrites is the write counter last seen per shard ("" on one Redis,
// "<first>-<last>" on a Cluster) under its generation.
type seenWrites struct {
	mu   sync.Mutex
	m    map[string]seenCounter
	lost atomic.Uint64
}

type seenCounter struct {
	gen string
	n   int64
}

// floors returns the counters answered so far, per shard: a call sent now
// runs after the calls they came from, so Redis must answer it more than
// each, unless it lost writes. An instance's calls overlap (a heartbeat and
// a suspension, say), and their replies come in any order: compared with
// the highest counter seen when its reply came instead of when it was
// sent, a reply overtaken by a later call's read as lost writes, and moved
// the whole fleet to a raise (TestOverlappingFleetCallsAreNotLostWrites).
func (s *seenWrites) floors() map[string]seenCounter {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) == 0 {
		return nil
	}
	out := make(map[string]seenCounter, len(s.m))
	for k, v := range s.m {
		out[k] = v
	}
	return out
}

// LostWrites counts the times this instance found that Redis had lost
// writes it acknowledged (a write counter that went back).
func (l *Store) lostWrites() uint64 { return l.seen.lost.Load() }

// checkCounter records the write counter n that shard answered under gen,
// to a call sent when the counters answered were floors, and returns the
// shard's generation: gen, or a new "lag-" one if n is not above the
// counter answered under gen before the call was sent (the shard lost
// writes).
func (l *Store) checkCounter(ctx context.Context, client redis.ScriptingFunctionsCmdable, floors map[string]seenCounter, shard, genKey, gen string, n int64) (string, error) {
	floor, known := floors[shard]
	if !known || floor.gen != gen || n > floor.n {
		l.seen.mu.Lock()
		if l.seen.m == nil {
			l.seen.m = map[string]seenCounter{}
		}
		if last, ok := l.seen.m[shard]; !ok || last.gen != gen || n > last.n {
			l.seen.m[shard] = seenCounter{gen: gen, n: n}
		}
		l.seen.mu.Unlock()
		return gen, nil
	}
	next, err := fcall(ctx, client, fnLag, []string{genKey}, gen, lagPrefix+randomHex(), randomHex()).Text()
	if err != nil {
		return "", classify(ctx, err)
	}
	l.seen.lost.Add(1)
	l.seen.mu.Lock()
	l.seen.m[shard] = seenCounter{gen: next, n: n}
	l.seen.mu.Unlock()
	return next, nil
}

func randomHex() string {
	var g [12]byte
	_, _ = rand.Read(g[:])
	return hex.EncodeToString(g[:])
}

// Loss says, for each key, what a change of generation from old to new
// lost: nothing, everything (a wipe: its usage is added back), or its recent
// writes (it is raised to its floor). On a Cluster, only the keys whose
// slots lie in a range whose generation changed lost anything: the other
// masters kept their data. A range that did not exist before (the slots were
// resharded) is not taken as lost: putting its keys' usage back on top of
// what they hold would charge them twice.
func (l *Store) loss(old, new string) func(p ratelimit.Policy, id store.Identity) contract.Loss {
	kind := contract.LossNone
	if old != new {
		kind = contract.LossAll
		if strings.HasPrefix(new, lagPrefix) {
			kind = contract.LossRecent
		}
	}
	before, ok1 := parseShards(old)
	after, ok2 := parseShards(new)
	if !ok1 || !ok2 {
		return func(ratelimit.Policy, store.Identity) contract.Loss { return kind }
	}
	type span struct {
		first, last int
		loss        contract.Loss
	}
	var changed []span
	for r, g := range after {
		if was, ok := before[r]; ok && was != g {
			s := span{first: r[0], last: r[1], loss: contract.LossAll}
			if strings.HasPrefix(g, lagPrefix) {
				s.loss = contract.LossRecent
			}
			changed = append(changed, s)
		}
	}
	return func(_ ratelimit.Policy, id store.Identity) contract.Loss {
		tag := l.tag(id)
		s := slot(tag[1 : len(tag)-1])
		for _, r := range changed {
			if s >= r.first && s <= r.last {
				return r.loss
			}
		}
		return contract.LossNone
	}
}

// Raise raises keys to their floors (see contract.Floor) in one pipeline
// on the replay client, and returns the units each got back (0: it held its
// floor already). Raising is a max-merge, so a floor sent twice, or several
// instances' floors of one key, leave the key as the highest of them.
func (l *Store) raise(ctx context.Context, floors []contract.Floor) ([]int64, []error) {
	raised := make([]int64, len(floors))
	errs := make([]error, len(floors))
	client := l.client
	if l.replayClient != nil {
		client = l.replayClient
	}
	c, ok := client.(redis.Cmdable)
	if !ok {
		for i := range errs {
			errs[i] = errors.New("redisstore: raise needs a client that can pipeline")
		}
		return raised, errs
	}
	if err := loadLibrary(ctx, client); err != nil {
		for i := range errs {
			errs[i] = classify(ctx, err)
		}
		return raised, errs
	}
	var now int64
	if l.now != nil {
		now = l.now().UnixMicro()
	}
	pipe := c.Pipeline()
	cmds := make([]*redis.Cmd, len(floors))
	prefix := "raise:" + randomHex() + ":"
	for i, f := range floors {
		if err := f.Policy.Validate(); err != nil {
			errs[i] = err
			continue
		}
		p, s := f.Policy, f.State
		args := []any{now, "", p.Limit, p.Window.Microseconds(), p.Capacity()}
		switch p.Algorithm {
		case ratelimit.TokenBucket:
			args[1] = "tb"
			args = append(args, s.Tokens, s.Now)
		case ratelimit.GCRA:
			args[1] = "gcra"
			args = append(args, s.TAT, s.TATRem)
		case ratelimit.SlidingWindowCounter:
			args[1] = "swc"
			args = append(args, s.WindowStart, s.Current, s.Previous)
		case ratelimit.SlidingWindowLog:
			args[1] = "swl"
			args = append(args, s.Now)
			for _, n := range s.Ages {
				args = append(args, n)
			}
			args = append(args, fmt.Sprintf("%s%d:", prefix, i))
		}
		cmds[i] = pipe.FCall(ctx, fnRaise, []string{l.keyOf(p, f.Identity)}, args...)
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx)
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		n, err := cmd.Int64()
		switch {
		case err != nil:
			errs[i] = classify(ctx, err)
		case n < 0:
			errs[i] = fmt.Errorf("%w: raise reply %d", ratelimit.ErrBadReply, n)
		default:
			raised[i] = n
		}
	}
	return raised, errs
}
