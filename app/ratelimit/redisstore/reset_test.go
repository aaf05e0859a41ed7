package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

type logged struct {
	policy ratelimit.Policy
	id     store.Identity
}

// TestReset: a reset deletes one identity's state under the policies named,
// and nothing else, and logs one entry per policy that ReadResets hands out
// once, in order, skipping an entry it cannot read.
func TestReset(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	gcra := ratelimit.Policy{Name: "r-gcra", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Hour, Burst: 3}
	swl := ratelimit.Policy{Name: "r-swl", Algorithm: ratelimit.SlidingWindowLog, Limit: 10, Window: time.Hour}
	for _, p := range []ratelimit.Policy{gcra, swl} {
		for _, k := range []string{"k:a", "k:b"} {
			if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: k}); err != nil {
				t.Fatal(err)
			}
		}
	}
	exists := func(p ratelimit.Policy, k string) bool {
		t.Helper()
		n, err := c.Exists(ctx, l.Key(p, k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	read := func(after string) (string, []logged) {
		t.Helper()
		var got []logged
		var prev int64
		last, at, err := l.Ext().ReadResets(ctx, after, func(p ratelimit.Policy, id store.Identity, at int64) {
			if at < prev || at <= 0 {
				t.Errorf("reset of %s at %d, after one at %d", p.Name, at, prev)
			}
			prev = at
			got = append(got, logged{p, id})
		})
		if err != nil {
			t.Fatal(err)
		}
		if at < prev {
			t.Errorf("read at %d, before a reset at %d", at, prev)
		}
		return last, got
	}

	start, got := read("")
	if start != "0-0" || got != nil {
		t.Fatalf("an empty log: %q %v, want 0-0 and nothing", start, got)
	}
	if err := l.Reset(ctx, "k:a", gcra); err != nil {
		t.Fatal(err)
	}
	if exists(gcra, "k:a") || !exists(swl, "k:a") || !exists(gcra, "k:b") || !exists(swl, "k:b") {
		t.Errorf("after resetting k:a under %s: k:a %v/%v, k:b %v/%v; want only k:a's %s gone",
			gcra.Name, exists(gcra, "k:a"), exists(swl, "k:a"), exists(gcra, "k:b"), exists(swl, "k:b"), gcra.Name)
	}
	if d, err := l.Decide(ctx, ratelimit.Request{Policy: gcra, Key: "k:a"}); err != nil || d.Remaining != 2 {
		t.Errorf("k:a after the reset: %+v %v, want a full burst again (2 left)", d, err)
	}
	// An entry nobody can read (a tool's, a newer version's) is skipped.
	if err := c.XAdd(ctx, &redis.XAddArgs{Stream: l.ResetLogKey(), Values: []string{"id", "zz", "policy", "x"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Reset(ctx, "k:b", gcra, swl); err != nil {
		t.Fatal(err)
	}
	if exists(gcra, "k:b") || exists(swl, "k:b") || !exists(swl, "k:a") {
		t.Errorf("after resetting k:b under both: k:b %v/%v, k:a's %s %v", exists(gcra, "k:b"), exists(swl, "k:b"), swl.Name, exists(swl, "k:a"))
	}
	last, got := read(start)
	want := []logged{{gcra, store.IdentityOf("k:a")}, {gcra, store.IdentityOf("k:b")}, {swl, store.IdentityOf("k:b")}}
	if !slices.Equal(got, want) {
		t.Errorf("read from the start: %+v\nwant %+v", got, want)
	}
	if again, got := read(last); again != last || got != nil {
		t.Errorf("read again: %q %v, want %q and nothing", again, got, last)
	}
	if end, all := read(""); end != last || !slices.Equal(all, want) {
		t.Errorf("read from the log's start: %q %+v, want %q %+v", end, all, last, want)
	}
	if ttl, err := c.PTTL(ctx, l.ResetLogKey()).Result(); err != nil || ttl <= 0 || ttl > redisstore.ResetLogTTL {
		t.Errorf("the log's TTL: %v %v, want at most %v", ttl, err, redisstore.ResetLogTTL)
	}
	for name, err := range map[string]error{
		"no policy":   l.Reset(ctx, "k:a"),
		"empty key":   l.Reset(ctx, "", gcra),
		"bad policy":  l.Reset(ctx, "k:a", ratelimit.Policy{Name: "x"}),
		"control key": l.Reset(ctx, "k:\x01", gcra),
	} {
		if !errors.Is(err, ratelimit.ErrInvalidRequest) && !errors.Is(err, ratelimit.ErrInvalidPolicy) {
			t.Errorf("%s: %v, want an invalid request or policy", name, err)
		}
	}
}

// TestReplayAfterAResetIsFenced: a replay batch sent by an instance that
// last read the reset log before the key's reset is refused with
// contract.ErrFenced and changes nothing, for every algorithm; sent again
// once the log is read, it is applied.
func TestReplayAfterAResetIsFenced(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{})
	ctx := context.Background()
	for _, alg := range contract.Algorithms {
		p := ratelimit.Policy{Name: "fence-" + string(alg), Algorithm: alg, Limit: 10, Window: time.Hour}
		_, before, err := l.Ext().ReadResets(ctx, "", func(ratelimit.Policy, store.Identity, int64) {})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Reset(ctx, "k:f", p); err != nil {
			t.Fatal(err)
		}
		batch := store.ReplayBatch{Policy: p, Identity: store.IdentityOf("k:f"), Marker: "app1:1",
			Grants: []store.Grant{{At: time.Now().UnixMicro(), Cost: 3, ID: "g1"}}, ResetsRead: before}
		_, errs := l.Replay(ctx, []store.ReplayBatch{batch})
		if !errors.Is(errs[0], contract.ErrFenced) {
			t.Fatalf("%s: a replay that knew no reset: %v, want ErrFenced", alg, errs[0])
		}
		d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k:f", ReadOnly: true})
		if err != nil || d.Remaining != 10 {
			t.Fatalf("%s after the fenced replay: %+v %v, want 10 left", alg, d, err)
		}
		_, batch.ResetsRead, err = l.Ext().ReadResets(ctx, "", func(ratelimit.Policy, store.Identity, int64) {})
		if err != nil {
			t.Fatal(err)
		}
		res, errs := l.Replay(ctx, []store.ReplayBatch{batch})
		if errs[0] != nil || res[0].Replayed != 3 {
			t.Fatalf("%s: the replay after reading the log: %+v %v, want 3 replayed", alg, res[0], errs[0])
		}
	}
}

// TestUsageCarriesOverAPolicyChange: a key spent under a policy stays spent
// when the policy is reloaded with another limit (lowered or raised), for
// every algorithm: the token bucket keeps its tokens (none), GCRA the time
// until the key is full again (an hour: all of the new quota), the window
// algorithms their grants (10 of the new limit). Another window starts the
// key afresh.
func TestUsageCarriesOverAPolicyChange(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{})
	ctx := context.Background()
	for _, alg := range contract.Algorithms {
		p := ratelimit.Policy{Name: "carry-" + string(alg), Algorithm: alg, Limit: 10, Window: time.Hour}
		for n := range 10 {
			if d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k", ID: fmt.Sprint(n)}); err != nil || !d.Allowed {
				t.Fatalf("%s %d: %+v %v", alg, n, d, err)
			}
		}
		left := func(q ratelimit.Policy) int64 {
			t.Helper()
			d, err := l.Decide(ctx, ratelimit.Request{Policy: q, Key: "k", ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			return d.Remaining
		}
		windowed := alg == ratelimit.SlidingWindowLog || alg == ratelimit.SlidingWindowCounter
		for _, c := range []struct {
			limit, burst int64
			want         int64
		}{{20, 0, map[bool]int64{true: 10, false: 0}[windowed]}, {5, 0, 0}, {10, 0, 0}} {
			q := p
			q.Limit = c.limit
			if got := left(q); got != c.want {
				t.Errorf("%s spent at limit 10, read at limit %d: %d left, want %d", alg, c.limit, got, c.want)
			}
		}
		q := p
		q.Window = 2 * time.Hour
		if got := left(q); got != q.Limit {
			t.Errorf("%s under another window: %d left, want a fresh %d", alg, got, q.Limit)
		}
	}
}
