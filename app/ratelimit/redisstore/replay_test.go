package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/vectors"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// TestReplayVectors runs the replay table against the Lua replay scripts.
func TestReplayVectors(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	for i, c := range vectors.ReplayCases {
		t.Run(c.Name, func(t *testing.T) {
			var now int64
			l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{Clock: func() time.Time { return time.UnixMicro(now) }})
			key := fmt.Sprintf("replay-%d", i)
			step := func(s vectors.Step, id string) contract.Decision {
				now = vectors.T0 + s.At
				d, err := l.DecideWire(context.Background(), contract.Request{Request: ratelimit.Request{Policy: c.Policy, Key: key, Cost: s.Cost, ID: id}, Weight: s.Weight})
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			for j, s := range c.Before {
				step(s, fmt.Sprint("before-", j))
			}
			now = vectors.T0 + c.At
			batch := store.ReplayBatch{Policy: c.Policy, Identity: store.IdentityOf(key), Marker: "i1:1", Grants: c.AbsGrants()}
			res, errs := l.Replay(context.Background(), []store.ReplayBatch{batch})
			if errs[0] != nil {
				t.Fatal(errs[0])
			}
			if res[0] != c.Result {
				t.Errorf("replay: %+v, want %+v", res[0], c.Result)
			}
			// The same batch again (a retry) changes nothing.
			res, errs = l.Replay(context.Background(), []store.ReplayBatch{batch})
			var units int64
			for _, g := range batch.Grants {
				units += g.Cost
			}
			if errs[0] != nil || res[0] != (store.ReplayResult{Duplicate: true, DuplicateUnits: units}) {
				t.Fatalf("second replay: %+v %v, want a duplicate", res[0], errs[0])
			}
			for j, s := range c.After {
				want := c.Decision(s)
				want.Mode = ratelimit.ModeRedis
				if got := withoutHint(step(s, fmt.Sprint("after-", j))); got != want {
					t.Errorf("after step %d:\n got %+v\nwant %+v", j, got, want)
				}
			}
		})
	}
}

// TestReplayDoesNotCountARequestTwice: a decision that timed out but still
// ran in Redis, then granted locally and journaled under the same request
// id, is present once in the sliding window log.
func TestReplayDoesNotCountARequestTwice(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	p := ratelimit.Policy{Name: "dup", Algorithm: ratelimit.SlidingWindowLog, Limit: 10, Window: time.Minute}
	ctx := context.Background()
	d, err := l.DecideWire(ctx, contract.Request{Request: ratelimit.Request{Policy: p, Key: "k", ID: "req-1"}})
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	at := d.State.Now
	b := store.ReplayBatch{Policy: p, Identity: store.IdentityOf("k"), Marker: "app1:7", Grants: []store.Grant{
		{At: at + 1000, Cost: 1, ID: "req-1"}, {At: at + 2000, Cost: 1, ID: "req-2"},
	}}
	res, errs := l.Replay(ctx, []store.ReplayBatch{b})
	if errs[0] != nil || res[0] != (store.ReplayResult{Replayed: 1, Present: 1}) {
		t.Fatalf("replay: %+v %v, want 1 replayed and 1 present", res[0], errs[0])
	}
	members, err := c.ZRange(ctx, l.Key(p, "k"), 0, -1).Result()
	if err != nil || len(members) != 2 || members[0] != "req-1" || members[1] != "req-2" {
		t.Fatalf("members %v %v, want exactly req-1 and req-2", members, err)
	}
	if ttl := c.PTTL(ctx, l.MarkerKey(b)).Val(); ttl <= 0 {
		t.Fatalf("marker TTL %v, want set", ttl)
	}
}

// TestReplayPipelinesManyKeys replays 20 000 keys in one call and reports
// the time (a benchmark measures it properly).
func TestReplayPipelinesManyKeys(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{})
	p := ratelimit.Policy{Name: "many", Algorithm: ratelimit.SlidingWindowCounter, Limit: 100, Window: time.Minute}
	now := time.Now().UnixMicro()
	batches := make([]store.ReplayBatch, 20_000)
	for i := range batches {
		batches[i] = store.ReplayBatch{Policy: p, Identity: store.IdentityOf(fmt.Sprint("k", i)), Marker: "app1:1",
			Grants: []store.Grant{{At: now, Cost: 1, ID: fmt.Sprint("r", i)}}}
	}
	start := time.Now()
	res, errs := l.Replay(context.Background(), batches)
	t.Logf("replayed %d keys in %v", len(batches), time.Since(start))
	for i := range res {
		if errs[i] != nil || res[i].Replayed != 1 {
			t.Fatalf("batch %d: %+v %v", i, res[i], errs[i])
		}
	}
}

// BenchmarkReplay100kKeys replays a journal of 100 000 keys (one grant each)
// in pipelines of 1000, as the resilient limiter does, with the service's
// shipped clients: 50 ms for decisions, RL_REPLAY_TIMEOUT (2 s) and two
// connections for replays.
func BenchmarkReplay100kKeys(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	client := func(timeout time.Duration, pool int) redis.UniversalClient {
		c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{srv.Addr()}, Timeout: timeout, PoolSize: pool})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	l := redisstore.New(client(50*time.Millisecond, 64), redisstore.Config{ReplayClient: client(2*time.Second, 2)})
	p := ratelimit.Policy{Name: "bench", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: time.Minute}
	const keys = 100_000
	for i := 0; b.Loop(); i++ {
		now := time.Now().UnixMicro()
		for start := 0; start < keys; start += 1000 {
			batches := make([]store.ReplayBatch, 1000)
			for k := range batches {
				batches[k] = store.ReplayBatch{Policy: p, Identity: store.IdentityOf(fmt.Sprint("k", start+k)), Marker: fmt.Sprint("bench:", i),
					Grants: []store.Grant{{At: now, Cost: 1, ID: fmt.Sprint("r", i)}}}
			}
			if _, errs := l.Replay(context.Background(), batches); errs[0] != nil {
				b.Fatal(errs[0])
			}
		}
	}
	b.ReportMetric(float64(keys)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
}

// TestReplayBoundsWorkPerCall: a hot key's batch of 2500 grants is folded in
// three script calls of at most MaxReplayGrants, leaving the state one call
// would (the Go twin's); sent again, all of it is a duplicate.
func TestReplayBoundsWorkPerCall(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	now := vectors.T0 + 100*int64(time.Second/time.Microsecond)
	l := redisstore.New(c, redisstore.Config{Clock: func() time.Time { return time.UnixMicro(now) }})
	p := ratelimit.Policy{Name: "hot", Algorithm: ratelimit.TokenBucket, Limit: 100, Window: time.Second}
	const n = 2500
	grants := make([]store.Grant, n)
	for i := range grants {
		grants[i] = store.Grant{At: vectors.T0 + int64(i)*20_000, Cost: 1, ID: fmt.Sprint("g", i)}
	}
	batch := store.ReplayBatch{Policy: p, Identity: store.IdentityOf("hot"), Marker: "i1:7", Grants: grants}
	ctx := context.Background()
	calls := func() int64 { return commandCalls(t, c, "fcall") }
	before := calls()
	res, errs := l.Replay(ctx, []store.ReplayBatch{batch})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if want := (store.ReplayResult{Replayed: n}); res[0] != want {
		t.Fatalf("replay: %+v, want %+v", res[0], want)
	}
	if got, want := calls()-before, int64((n+redisstore.MaxReplayGrants-1)/redisstore.MaxReplayGrants); got != want {
		t.Errorf("%d script calls for %d grants, want %d (at most %d grants each)", got, n, want, redisstore.MaxReplayGrants)
	}
	twin, _ := algorithm.TokenBucketReplay(p, algorithm.TokenBucketState{}, now, grants)
	tokens, last, err := redistest.PairState(ctx, c, l.Key(p, "hot"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprintln(tokens, last), fmt.Sprintln(twin.Tokens, twin.Last); got != want {
		t.Errorf("state (tokens, last) %q, want the twin's %q", got, want)
	}
	res, errs = l.Replay(ctx, []store.ReplayBatch{batch})
	if errs[0] != nil || res[0] != (store.ReplayResult{Duplicate: true, DuplicateUnits: n}) {
		t.Fatalf("second replay: %+v %v, want all %d units duplicate", res[0], errs[0], n)
	}
}

// TestReplayHasItsOwnClient: go-redis cuts every socket read at the
// client's read timeout whatever the context allows, so a replay pipeline
// of 1000 keys fails on a client tuned for 10 ms decisions; on the replay
// client (Config.ReplayClient) it goes through, and the decisions keep their
// short timeout.
func TestReplayHasItsOwnClient(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	client := func(timeout time.Duration) redis.UniversalClient {
		c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{srv.Addr()}, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	p := ratelimit.Policy{Name: "many", Algorithm: ratelimit.SlidingWindowLog, Limit: 1000, Window: time.Minute}
	batches := func(marker string) []store.ReplayBatch {
		now := time.Now().UnixMicro()
		out := make([]store.ReplayBatch, 1000)
		for i := range out {
			g := make([]store.Grant, 100)
			for j := range g {
				g[j] = store.Grant{At: now - int64(j)*1000, Cost: 1, ID: fmt.Sprint(marker, i, "-", j)}
			}
			out[i] = store.ReplayBatch{Policy: p, Identity: store.IdentityOf(fmt.Sprint("k", i)), Marker: marker, Grants: g}
		}
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fast := client(10 * time.Millisecond)
	failed := 0
	for _, err := range second(redisstore.New(fast, redisstore.Config{}).Replay(ctx, batches("i1:1"))) {
		if err != nil {
			failed++
		}
	}
	if failed == 0 {
		t.Fatal("a 100 000-grant pipeline on a 10 ms client went through: the test no longer shows the cut")
	}
	l := redisstore.New(fast, redisstore.Config{ReplayClient: client(5 * time.Second), Timeout: 10 * time.Millisecond})
	for i, err := range second(l.Replay(ctx, batches("i1:2"))) {
		if err != nil {
			t.Fatalf("batch %d on the replay client: %v", i, err)
		}
	}
}

func second[A, B any](_ A, b B) B { return b }

// commandCalls returns how many times Redis ran command (as INFO
// commandstats names it: "fcall", "function|load").
func commandCalls(t *testing.T, c *redis.Client, command string) int64 {
	t.Helper()
	_, calls, _, err := redisstore.RedisInfo(context.Background(), c, command)
	if err != nil {
		t.Fatal(err)
	}
	return int64(calls)
}
