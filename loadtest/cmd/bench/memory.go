package main

// The memory rows: what a live key costs Redis, for each algorithm and for
// the peer redis_rate, measured from many keys in a fresh database.

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// MemRow is one row of results.json's memory: the Redis memory of one key
// of an algorithm, from Keys distinct keys that each had one decision of
// cost 1.
type MemRow struct {
	Name string `json:"name"`
	// Keys is the number of keys the row's decisions added (DBSIZE after
	// minus before), by which the used memory is divided.
	Keys int64 `json:"keys"`
	// RequestIDBytes is the length of the request id each decision carried;
	// 0: none (the script was called with an empty id).
	RequestIDBytes int `json:"request_id_bytes"`
	// KeyBytes is the length of a key's name.
	KeyBytes int `json:"key_bytes"`
	// Encoding is OBJECT ENCODING of a key.
	Encoding string `json:"encoding"`
	// UsedMemoryPerKey is INFO memory's used_memory after the keys were
	// written minus before, divided by Keys: a key with its share of
	// Redis' own structures (the keyspace and expires tables).
	UsedMemoryPerKey float64 `json:"used_memory_bytes_per_key"`
	// MemoryUsageMean is the mean of MEMORY USAGE key SAMPLES 0 over
	// Sampled keys spread over the row's: the key alone.
	MemoryUsageMean float64 `json:"memory_usage_bytes_mean"`
	Sampled         int     `json:"memory_usage_sampled"`
	// DecisionsPerS is how fast the keys were written.
	DecisionsPerS float64 `json:"decisions_per_s"`
	// Errors counts the decisions that failed (their keys may be missing:
	// Keys counts those that exist).
	Errors int64 `json:"errors,omitempty"`
}

// The policy of the memory rows: a long window and a low rate, so that no
// key expires while the rows are measured (after one unit a GCRA or token
// bucket key lives for window/limit, 6 minutes; a window counter's for two
// windows, a log's for one).
const (
	memPolicyName = "per-user"
	memLimit      = 10
	memWindow     = time.Hour
	memSampled    = 1000
	memWriters    = 64 // goroutines writing keys
)

// requestIDBytes is the length of the request id the service gives each
// request (httplimit: 16 random bytes in hex).
const requestIDBytes = 32

// memIdentity is the client identity of key i, as an API key or user id
// would be.
func memIdentity(i int) string { return fmt.Sprintf("user-%08d", i) }

// memVariant is one memory row: how to decide identity i, and the name of
// the key it leaves.
type memVariant struct {
	name   string
	idLen  int
	decide func(ctx context.Context, i int) error
	key    func(i int) string
}

// memoryRows measures the memory row only names, or those whose names
// start with it (all of them when only is not under memory/) on client, which must reach a fresh
// Redis at addr (the rows FLUSHALL it between them, and at the end): n
// keys each. rs is our store on client, as the ours/* rows use it.
func memoryRows(ctx context.Context, addr string, client redis.UniversalClient, rs *redisstore.Store, n int, only string, lv *live) ([]MemRow, error) {
	if n < memSampled {
		return nil, fmt.Errorf("-mem-keys %d: want 0 (skip) or at least %d", n, memSampled)
	}
	// The flushes and readings go on a client of their own: a FLUSHALL of
	// a million keys takes longer than a decision may.
	admin := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	defer admin.Close()
	if size, err := admin.DBSize(ctx).Result(); err != nil {
		return nil, fmt.Errorf("memory: %w", err)
	} else if size != 0 {
		return nil, fmt.Errorf("memory: the Redis holds %d keys; the memory rows flush it, so they need a fresh Redis (-mem-keys 0 leaves them out)", size)
	}
	// The -no-id rows call the library's functions directly.
	code, _ := redisstore.Library(ratelimit.GCRA)
	if err := client.FunctionLoadReplace(ctx, code).Err(); err != nil {
		return nil, fmt.Errorf("memory: FUNCTION LOAD: %w", err)
	}
	var variants []memVariant
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter, ratelimit.GCRA} {
		p := ratelimit.Policy{Name: memPolicyName, Algorithm: alg, Limit: memLimit, Window: memWindow}
		key := func(i int) string { return rs.Key(p, memIdentity(i)) }
		variants = append(variants, memVariant{
			name: "memory/ours/" + string(alg), idLen: requestIDBytes, key: key,
			decide: func(ctx context.Context, i int) error {
				d, err := rs.Decide(ctx, ratelimit.Request{Policy: p, Key: memIdentity(i), ID: randomID()})
				if err == nil && !d.Allowed {
					err = errors.New("refused")
				}
				return err
			},
		}, memVariant{
			// The same script and key with an empty request id: the
			// admission field (lua/once.lua) is not written, and the log's
			// member is "". No deployment does this (the store makes an id
			// up for a request without one): it shows what the id costs.
			name: "memory/ours/" + string(alg) + "-no-id", key: key,
			decide: func(ctx context.Context, i int) error {
				_, fn := redisstore.Library(alg)
				return client.FCall(ctx, fn, []string{key(i)},
					0, p.Limit, p.Window.Microseconds(), p.Capacity(), 1, "", 1, 1).Err()
			},
		})
	}
	rr := redis_rate.NewLimiter(client)
	variants = append(variants, memVariant{
		name: "memory/peer/redis_rate", key: func(i int) string { return "rate:" + memIdentity(i) },
		decide: func(ctx context.Context, i int) error {
			r, err := rr.Allow(ctx, memIdentity(i), redis_rate.PerHour(memLimit))
			if err == nil && r.Allowed == 0 {
				err = errors.New("refused")
			}
			return err
		},
	})

	var rows []MemRow
	// -only names one row, or the rows under a prefix.
	exact := slices.ContainsFunc(variants, func(v memVariant) bool { return v.name == only })
	for _, v := range variants {
		if exact && v.name != only || strings.HasPrefix(only, "memory/") && !strings.HasPrefix(v.name, only) {
			continue
		}
		lv.prog.Phase(fmt.Sprintf("memory, %s, %d keys", v.name, n))
		r, err := measureMemory(ctx, admin, v, n, lv)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
		fmt.Fprintf(display, "%-36s %8d keys  used_memory %6.1f B/key  MEMORY USAGE %6.1f B  (%s, key %d B, request id %d B, %.0f/s)\n",
			r.Name, r.Keys, r.UsedMemoryPerKey, r.MemoryUsageMean, r.Encoding, r.KeyBytes, r.RequestIDBytes, r.DecisionsPerS)
		rows = append(rows, r)
	}
	lv.prog.Phase("")
	return rows, admin.FlushAll(ctx).Err()
}

// measureMemory flushes the database (through admin), warms the
// connections and the scripts, and writes n keys through v from
// memWriters goroutines between two readings of used_memory.
func measureMemory(ctx context.Context, admin *redis.Client, v memVariant, n int, lv *live) (MemRow, error) {
	if err := admin.FlushAll(ctx).Err(); err != nil {
		return MemRow{}, err
	}
	// Warm-up on keys of their own, as many at once as the writers will
	// run: the connections are open and the scripts loaded before the
	// first reading, so that only the keys differ between the two.
	var wg sync.WaitGroup
	for w := range memWriters {
		wg.Go(func() {
			for j := range 4 {
				_ = v.decide(ctx, n+w*4+j)
			}
		})
	}
	wg.Wait()
	if err := admin.FlushAll(ctx).Err(); err != nil {
		return MemRow{}, err
	}
	used0, size0, err := usedMemory(ctx, admin)
	if err != nil {
		return MemRow{}, err
	}

	counts := lv.begin(v.name, memWriters)
	var next, errs atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	for w := range memWriters {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := v.decide(ctx, i); err != nil {
					errs.Add(1)
					counts[w].errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				counts[w].ok.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	lv.end(counts)
	used1, size1, err := usedMemory(ctx, admin)
	if err != nil {
		return MemRow{}, err
	}
	row := MemRow{Name: v.name, Keys: size1 - size0, RequestIDBytes: v.idLen, KeyBytes: len(v.key(0)),
		DecisionsPerS: round(float64(n) / elapsed.Seconds()), Errors: errs.Load()}
	if e := firstErr.Load(); e != nil {
		fmt.Fprintf(display, "bench: %s: %d of %d decisions failed, first: %v\n", v.name, row.Errors, n, e)
	}
	if row.Keys < int64(n)*99/100 {
		return row, fmt.Errorf("%d keys written of %d (%d decisions failed)", row.Keys, n, row.Errors)
	}
	row.UsedMemoryPerKey = round(float64(used1-used0) / float64(row.Keys))
	row.Encoding, _ = admin.ObjectEncoding(ctx, v.key(0)).Result()

	// MEMORY USAGE of memSampled keys spread over the n, in one pipeline.
	cmds := make([]*redis.IntCmd, 0, memSampled)
	_, err = admin.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j := range memSampled {
			cmds = append(cmds, p.MemoryUsage(ctx, v.key(j*(n/memSampled)), 0))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return row, fmt.Errorf("MEMORY USAGE: %w", err)
	}
	var sum int64
	for _, c := range cmds {
		if b, err := c.Result(); err == nil {
			sum += b
			row.Sampled++
		}
	}
	if row.Sampled > 0 {
		row.MemoryUsageMean = round(float64(sum) / float64(row.Sampled))
	}
	return row, nil
}

// usedMemory returns INFO memory's used_memory and DBSIZE.
func usedMemory(ctx context.Context, client *redis.Client) (used, keys int64, err error) {
	info, err := client.Info(ctx, "memory").Result()
	if err != nil {
		return 0, 0, err
	}
	used, ok := infoInt(info, "used_memory")
	if !ok {
		return 0, 0, errors.New("INFO memory: no used_memory")
	}
	keys, err = client.DBSize(ctx).Result()
	return used, keys, err
}

// randomID returns a request id like the service's: requestIDBytes hex
// digits.
func randomID() string {
	var b [requestIDBytes / 2]byte
	for i := 0; i < len(b); i += 8 {
		u := rand.Uint64()
		for j := range 8 {
			b[i+j] = byte(u >> (8 * j))
		}
	}
	return hex.EncodeToString(b[:])
}

// memoryText is the memory section of docs/BENCHMARKS.md.
func memoryText(rows []MemRow) string {
	if len(rows) == 0 {
		return ""
	}
	s := "\n## Redis memory per key\n\n" +
		"Each row fills a fresh database (FLUSHALL before it) with distinct live keys, one decision of cost 1 each (policy `" + memPolicyName + "`, " +
		strconv.Itoa(memLimit) + " per hour, so that no key expires meanwhile; identities `user-00000000` and up), " +
		"from " + strconv.Itoa(memWriters) + " goroutines: `memory/ours/*` through redisstore on the client the `ours/*` rows use, " +
		"each decision with a " + strconv.Itoa(requestIDBytes) + "-character request id as the service gives every request (kept in the key's admission field, or as the log's member); " +
		"`*-no-id` the same script and key with an empty id, which no deployment sends (the store makes an id up for a request without one): what the id costs; " +
		"`memory/peer/redis_rate` go-redis/redis_rate v10 (`PerHour(" + strconv.Itoa(memLimit) + ")`). " +
		"`used_memory B/key` is INFO memory's used_memory after minus before over the keys added (DBSIZE): the key with its share of the keyspace and expires tables, what sizing needs; " +
		"`MEMORY USAGE B` the mean of `MEMORY USAGE key SAMPLES 0` over a sample of keys. " +
		"[SCALING.md](SCALING.md) turns these figures and the Redis CPU per decision into a plan for more than one Redis.\n\n" +
		"| row | keys | key name B | request id B | encoding | used_memory B/key | MEMORY USAGE B (keys sampled) | keys written/s |\n" +
		"| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |\n"
	for _, r := range rows {
		s += fmt.Sprintf("| %s | %d | %d | %d | %s | %.1f | %.1f (%d) | %.0f |\n",
			r.Name, r.Keys, r.KeyBytes, r.RequestIDBytes, r.Encoding, r.UsedMemoryPerKey, r.MemoryUsageMean, r.Sampled, r.DecisionsPerS)
	}
	return s
}
