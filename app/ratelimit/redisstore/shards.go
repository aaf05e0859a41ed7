package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// On a Cluster, each master can lose its data on its own (a master restarted
// empty, with no replica to fail over to). One generation key would notice
// only its own master's loss, so the generation is one key per slot range,
// each hashed into that range, and Generation (and Heartbeat) return them
// all: "<first slot>-<last slot>=<generation>,...". A restore after a change
// puts back only the keys whose slots lie in a range whose generation
// changed (Loss): the other masters still hold their usage.

// shardGenLua returns a range's generation (KEYS[1], set to ARGV[1] if
// none) and increments its write counter (KEYS[2], lost.go).
const shardGenLua = `local g = redis.call('GET', KEYS[1])
if not g then
  redis.call('SET', KEYS[1], ARGV[1])
  g = ARGV[1]
end
return {g, redis.call('INCR', KEYS[2])}`

// slotCount is the number of Cluster hash slots.
const slotCount = 16384

// shardLayout is the Cluster's slot ranges and, for each, a generation key
// hashed into it; refreshed every layoutTTL.
type shardLayout struct {
	mu     sync.Mutex
	at     time.Time
	ranges []slotRange
}

type slotRange struct {
	first, last int
	key, writes string // the generation and the write counter
}

const layoutTTL = 5 * time.Second

// Sharded reports whether the store is a Redis Cluster: its masters fail
// independently, so one refusing a call says nothing of the others.
func (l *Store) sharded() bool {
	_, ok := l.client.(*redis.ClusterClient)
	return ok
}

// clusterGeneration returns the per-range generations of a Cluster, and
// false for a client that is not one.
func (l *Store) clusterGeneration(ctx context.Context) (string, bool, error) {
	cc, ok := l.client.(*redis.ClusterClient)
	if !ok {
		return "", false, nil
	}
	ranges, err := l.slotRanges(ctx, cc)
	if err != nil {
		return "", true, err
	}
	floors := l.seen.floors()
	pipe := cc.Pipeline()
	cmds := make([]*redis.Cmd, len(ranges))
	for i, r := range ranges {
		cmds[i] = pipe.FCall(ctx, fnShardGen, []string{r.key, r.writes}, randomHex())
	}
	_, _ = pipe.Exec(ctx)
	var b strings.Builder
	for i, r := range ranges {
		res, err := cmds[i].Slice()
		if functionMissing(err) {
			res, err = fcall(ctx, cc, fnShardGen, []string{r.key, r.writes}, randomHex()).Slice()
		}
		var g string
		if err == nil {
			var n int64
			var ok1, ok2 bool
			if len(res) == 2 {
				g, ok1 = res[0].(string)
				n, ok2 = res[1].(int64)
			}
			if !ok1 || !ok2 {
				err = fmt.Errorf("%w: shard generation reply %v", ratelimit.ErrBadReply, res)
			} else {
				g, err = l.checkCounter(ctx, cc, floors, fmt.Sprintf("%d-%d", r.first, r.last), r.key, g, n)
			}
		}
		if err != nil {
			l.shards.mu.Lock()
			l.shards.at = time.Time{} // the layout may have moved: read it again
			l.shards.mu.Unlock()
			return "", true, classify(ctx, err)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d-%d=%s", r.first, r.last, g)
	}
	return b.String(), true, nil
}

// slotRanges returns the Cluster's slot ranges with their generation keys,
// from CLUSTER SHARDS (CLUSTER SLOTS before Redis 7) at most every
// layoutTTL.
func (l *Store) slotRanges(ctx context.Context, cc *redis.ClusterClient) ([]slotRange, error) {
	l.shards.mu.Lock()
	defer l.shards.mu.Unlock()
	if l.shards.ranges != nil && time.Since(l.shards.at) < layoutTTL {
		return l.shards.ranges, nil
	}
	var spans [][2]int
	if shards, err := cc.ClusterShards(ctx).Result(); err == nil {
		for _, sh := range shards {
			for _, r := range sh.Slots {
				spans = append(spans, [2]int{int(r.Start), int(r.End)})
			}
		}
	} else {
		// Redis before 7.0 has no CLUSTER SHARDS.
		//lint:ignore SA1019 the fallback for servers without CLUSTER SHARDS
		slots, err := cc.ClusterSlots(ctx).Result()
		if err != nil {
			return nil, classify(ctx, err)
		}
		for _, s := range slots {
			spans = append(spans, [2]int{int(s.Start), int(s.End)})
		}
	}
	ranges := make([]slotRange, 0, len(spans))
	for _, sp := range spans {
		tag, ok := tagIn(l.prefix, sp[0], sp[1])
		if !ok {
			return nil, fmt.Errorf("%w: no generation key for slots %d-%d", ratelimit.ErrBadReply, sp[0], sp[1])
		}
		ranges = append(ranges, slotRange{first: sp[0], last: sp[1], key: "{" + tag + "}:generation", writes: "{" + tag + "}:writes"})
	}
	slices.SortFunc(ranges, func(a, b slotRange) int { return a.first - b.first })
	l.shards.ranges, l.shards.at = ranges, time.Now()
	return ranges, nil
}

// tagIn finds a hash tag "<prefix>:gen:<n>" whose slot lies in [first, last].
func tagIn(prefix string, first, last int) (string, bool) {
	for n := range 1 << 20 {
		tag := prefix + ":gen:" + strconv.Itoa(n)
		if s := slot(tag); s >= first && s <= last {
			return tag, true
		}
	}
	return "", false
}

// slot is the Cluster hash slot of a hash tag's content: CRC16 (XMODEM)
// modulo 16384.
func slot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % slotCount
}

// parseShards reads "<first>-<last>=<generation>,..." (false for a single
// Redis' plain generation).
func parseShards(gen string) (map[[2]int]string, bool) {
	if !strings.Contains(gen, "=") {
		return nil, false
	}
	out := map[[2]int]string{}
	for part := range strings.SplitSeq(gen, ",") {
		rng, g, ok := strings.Cut(part, "=")
		a, b, ok2 := strings.Cut(rng, "-")
		first, err1 := strconv.Atoi(a)
		last, err2 := strconv.Atoi(b)
		if !ok || !ok2 || err1 != nil || err2 != nil {
			return nil, false
		}
		out[[2]int{first, last}] = g
	}
	return out, true
}
