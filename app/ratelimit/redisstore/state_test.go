package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/vectors"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// stateForms are two stores over one Redis, each with a client of its own:
// one that keeps the token bucket's and GCRA's state in a hash, as earlier
// releases do (WithHashState), and one that keeps it in a string.
func stateForms(t *testing.T, addr string, now *int64) [2]*redisstore.Store {
	clock := redisstore.WithClock(func() time.Time { return time.UnixMicro(*now) })
	return [2]*redisstore.Store{
		redisstore.New(newClient(t, addr), clock, redisstore.WithHashState()),
		redisstore.New(newClient(t, addr), clock),
	}
}

// pairState: the algorithms whose state is a string (lua/state.lua).
func pairState(a ratelimit.Algorithm) bool {
	return a == ratelimit.TokenBucket || a == ratelimit.GCRA
}

// TestStateCarriesOverBetweenForms decides every token bucket and GCRA
// vector with the two forms taking turns on one key: each reads what the
// other wrote, so the key keeps its usage through a rolling upgrade and
// back, and the answers are the table's. The replay vectors too, replayed
// by either form.
func TestStateCarriesOverBetweenForms(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	for i, c := range vectors.All() {
		if !pairState(c.Policy.Algorithm) {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			var now int64
			forms := stateForms(t, srv.Addr(), &now)
			key := fmt.Sprintf("forms-%d", i)
			for j, s := range c.Steps {
				now = vectors.T0 + s.At
				got, err := forms[j%2].Decide(context.Background(), ratelimit.Request{Policy: c.Policy, Key: key, Cost: s.Cost, ReadOnly: s.ReadOnly, Weight: s.Weight, ID: fmt.Sprintf("req-%d", j)})
				if err != nil {
					t.Fatal(err)
				}
				want := c.Decision(s)
				want.Mode = ratelimit.ModeRedis
				if got := withoutHint(got); got != want {
					t.Errorf("step %d (form %d):\n got %+v\nwant %+v", j, j%2, got, want)
				}
			}
		})
	}
	for i, c := range vectors.ReplayCases {
		if !pairState(c.Policy.Algorithm) {
			continue
		}
		for f := range 2 {
			t.Run(fmt.Sprintf("%s/replayed by form %d", c.Name, f), func(t *testing.T) {
				var now int64
				forms := stateForms(t, srv.Addr(), &now)
				key := fmt.Sprintf("forms-replay-%d-%d", i, f)
				step := func(l *redisstore.Store, s vectors.Step, id string) ratelimit.Decision {
					now = vectors.T0 + s.At
					d, err := l.Decide(context.Background(), ratelimit.Request{Policy: c.Policy, Key: key, Cost: s.Cost, Weight: s.Weight, ID: id})
					if err != nil {
						t.Fatal(err)
					}
					return d
				}
				for j, s := range c.Before {
					step(forms[1-f], s, fmt.Sprint("before-", j))
				}
				now = vectors.T0 + c.At
				batch := store.ReplayBatch{Policy: c.Policy, Identity: store.IdentityOf(key), Marker: "i1:1", Grants: c.AbsGrants()}
				for range 2 { // the second send is a duplicate
					if _, errs := forms[f].Replay(context.Background(), []store.ReplayBatch{batch}); errs[0] != nil {
						t.Fatal(errs[0])
					}
				}
				for j, s := range c.After {
					want := c.Decision(s)
					want.Mode = ratelimit.ModeRedis
					if got := withoutHint(step(forms[j%2], s, fmt.Sprint("after-", j))); got != want {
						t.Errorf("after step %d:\n got %+v\nwant %+v", j, got, want)
					}
				}
			})
		}
	}
}

// TestStateForms checks what each form leaves in Redis for the token
// bucket and GCRA: one string "<a>:<b>:<µs>:<id>" living until the state
// no longer matters, or the hash of fields that earlier releases read; and
// that a refusal writes nothing.
func TestStateForms(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	now := vectors.T0
	forms := stateForms(t, srv.Addr(), &now)
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		p := ratelimit.Policy{Name: "forms", Algorithm: alg, Limit: 10, Window: time.Minute, Burst: 2}
		for f, l := range forms {
			name := fmt.Sprint(alg, f)
			key := l.Key(p, name)
			var d ratelimit.Decision
			for i := range 2 {
				var err error
				if d, err = l.Decide(ctx, ratelimit.Request{Policy: p, Key: name, ID: fmt.Sprint("id-", i)}); err != nil || !d.Allowed {
					t.Fatalf("%s: %+v %v, want an admission", name, d, err)
				}
			}
			fa, fb, a, b := "t", "r", d.State.TAT, d.State.TATRem
			if alg == ratelimit.TokenBucket {
				fb, a, b = "l", d.State.Tokens, now
			}
			as, bs := strconv.FormatInt(a, 10), strconv.FormatInt(b, 10)
			adm := strconv.FormatInt(now, 10) + ":id-1"
			typ := c.Type(ctx, key).Val()
			if f == 0 {
				h := c.HGetAll(ctx, key).Val()
				if typ != "hash" || len(h) != 3 || h[fa] != as || h[fb] != bs || h["i"] != adm {
					t.Errorf("%s: hash form %s %v, want %s=%s %s=%s i=%s", name, typ, h, fa, as, fb, bs, adm)
				}
			} else if v, want := c.Get(ctx, key).Val(), as+":"+bs+":"+adm; typ != "string" || v != want {
				t.Errorf("%s: string form %s %q, want %q", name, typ, v, want)
			}
			if ttl, reset := c.PTTL(ctx, key).Val(), d.ResetAfter; ttl < reset || ttl > reset+2*time.Second {
				t.Errorf("%s: TTL %v, want the reset %v and a margin", name, ttl, reset)
			}
			// The third request is refused, and Redis runs no write for it.
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: name, ID: "id-2"}); err != nil || d.Allowed {
				t.Fatalf("%s: %+v %v, want a refusal", name, d, err)
			}
			stats := c.Info(ctx, "commandstats").Val()
			for _, w := range []string{"cmdstat_set:", "cmdstat_hset:", "cmdstat_pexpire:", "cmdstat_del:"} {
				if strings.Contains(stats, w) {
					t.Errorf("%s: a refusal ran %s\n%s", name, w, stats)
				}
			}
		}
	}
}

// TestReplayKnowsAnEarlierReleasesMarker: a token bucket or GCRA batch that
// an earlier release applied, marked in the key's hash, is not applied
// again; another is, and leaves a string.
func TestReplayKnowsAnEarlierReleasesMarker(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	now := vectors.T0
	l := redisstore.New(c, redisstore.WithClock(func() time.Time { return time.UnixMicro(now) }))
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		p := ratelimit.Policy{Name: "marked", Algorithm: alg, Limit: 10, Window: time.Minute}
		key := l.Key(p, "k")
		// Half the bucket taken, or the arrival time 12 s ahead.
		fields := []any{"t", strconv.FormatInt(5*p.WindowMicros(), 10), "l", strconv.FormatInt(now, 10)}
		if alg == ratelimit.GCRA {
			fields = []any{"t", strconv.FormatInt(now+12_000_000, 10), "r", "0"}
		}
		if err := c.HSet(ctx, key, append(fields, "m:i1", "3 4")...).Err(); err != nil {
			t.Fatal(err)
		}
		before := c.HGetAll(ctx, key).Val()
		batch := store.ReplayBatch{Policy: p, Identity: store.IdentityOf("k"), Marker: "i1:4", Grants: []store.Grant{{At: now - 1000, Cost: 3, ID: "g"}}}
		res, errs := l.Replay(ctx, []store.ReplayBatch{batch})
		if errs[0] != nil || !res[0].Duplicate {
			t.Fatalf("%s: replay %+v %v, want a duplicate", alg, res[0], errs[0])
		}
		if after := c.HGetAll(ctx, key).Val(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("%s: a duplicate changed the key from %v to %v", alg, before, after)
		}
		batch.Marker = "i1:5"
		if res, errs = l.Replay(ctx, []store.ReplayBatch{batch}); errs[0] != nil || res[0].Replayed != 3 {
			t.Fatalf("%s: replay %+v %v, want 3 units replayed", alg, res[0], errs[0])
		}
		if typ := c.Type(ctx, key).Val(); typ != "string" {
			t.Errorf("%s: the replayed key is a %s, want a string", alg, typ)
		}
	}
}
