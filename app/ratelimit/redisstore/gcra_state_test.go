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

// gcraForms are two stores over one Redis, each with a client of its own:
// one that keeps GCRA's state in a hash, as earlier releases do
// (WithGCRAHashes), and one that keeps it in a string.
func gcraForms(t *testing.T, addr string, now *int64) [2]*redisstore.Store {
	clock := redisstore.WithClock(func() time.Time { return time.UnixMicro(*now) })
	return [2]*redisstore.Store{
		redisstore.New(newClient(t, addr), clock, redisstore.WithGCRAHashes()),
		redisstore.New(newClient(t, addr), clock),
	}
}

// TestGCRAKeyCarriesOverBetweenForms decides every GCRA vector with the two
// forms taking turns on one key: each reads what the other wrote, so the
// key keeps its usage through a rolling upgrade and back, and the answers
// are the table's.
func TestGCRAKeyCarriesOverBetweenForms(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	for i, c := range vectors.All() {
		if c.Policy.Algorithm != ratelimit.GCRA {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			var now int64
			forms := gcraForms(t, srv.Addr(), &now)
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
		if c.Policy.Algorithm != ratelimit.GCRA {
			continue
		}
		for f := range 2 {
			t.Run(fmt.Sprintf("%s/replayed by form %d", c.Name, f), func(t *testing.T) {
				var now int64
				forms := gcraForms(t, srv.Addr(), &now)
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

// TestGCRAStateForms checks what each form leaves in Redis: one string
// "<tat>:<rem>:<µs>:<id>" living until the state no longer matters, or the
// hash {t, r, i} that earlier releases read; and that a refusal writes
// nothing.
func TestGCRAStateForms(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	now := vectors.T0
	forms := gcraForms(t, srv.Addr(), &now)
	p := ratelimit.Policy{Name: "forms", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Minute, Burst: 2}
	for f, l := range forms {
		key := l.Key(p, fmt.Sprint("k", f))
		var d ratelimit.Decision
		for i := range 2 {
			var err error
			if d, err = l.Decide(ctx, ratelimit.Request{Policy: p, Key: fmt.Sprint("k", f), ID: fmt.Sprint("id-", i)}); err != nil || !d.Allowed {
				t.Fatalf("form %d: %+v %v, want an admission", f, d, err)
			}
		}
		tat, rem := strconv.FormatInt(d.State.TAT, 10), strconv.FormatInt(d.State.TATRem, 10)
		adm := strconv.FormatInt(now, 10) + ":id-1"
		typ := c.Type(ctx, key).Val()
		if f == 0 {
			h := c.HGetAll(ctx, key).Val()
			if typ != "hash" || len(h) != 3 || h["t"] != tat || h["r"] != rem || h["i"] != adm {
				t.Errorf("hash form: %s %v, want t=%s r=%s i=%s", typ, h, tat, rem, adm)
			}
		} else if v := c.Get(ctx, key).Val(); typ != "string" || v != tat+":"+rem+":"+adm {
			t.Errorf("string form: %s %q, want %q", typ, v, tat+":"+rem+":"+adm)
		}
		if ttl, reset := c.PTTL(ctx, key).Val(), d.ResetAfter; ttl < reset || ttl > reset+2*time.Second {
			t.Errorf("form %d: TTL %v, want the reset %v and a margin", f, ttl, reset)
		}
		// The third request is refused, and Redis runs no write for it.
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: fmt.Sprint("k", f), ID: "id-2"}); err != nil || d.Allowed {
			t.Fatalf("form %d: %+v %v, want a refusal", f, d, err)
		}
		stats := c.Info(ctx, "commandstats").Val()
		for _, w := range []string{"cmdstat_set:", "cmdstat_hset:", "cmdstat_pexpire:", "cmdstat_del:"} {
			if strings.Contains(stats, w) {
				t.Errorf("form %d: a refusal ran %s\n%s", f, w, stats)
			}
		}
	}
}

// TestGCRAReplayKnowsAnEarlierReleasesMarker: a batch that an earlier
// release applied, marked in the key's hash, is not applied again.
func TestGCRAReplayKnowsAnEarlierReleasesMarker(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	now := vectors.T0
	l := redisstore.New(c, redisstore.WithClock(func() time.Time { return time.UnixMicro(now) }))
	p := ratelimit.Policy{Name: "marked", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Minute}
	key := l.Key(p, "k")
	tat := strconv.FormatInt(now+12_000_000, 10)
	if err := c.HSet(ctx, key, "t", tat, "r", "0", "m:i1", "3 4").Err(); err != nil {
		t.Fatal(err)
	}
	batch := store.ReplayBatch{Policy: p, Identity: store.IdentityOf("k"), Marker: "i1:4", Grants: []store.Grant{{At: now - 1000, Cost: 3, ID: "g"}}}
	res, errs := l.Replay(ctx, []store.ReplayBatch{batch})
	if errs[0] != nil || !res[0].Duplicate {
		t.Fatalf("replay: %+v %v, want a duplicate", res[0], errs[0])
	}
	if got := c.HGet(ctx, key, "t").Val(); got != tat {
		t.Errorf("t = %s after a duplicate, want %s", got, tat)
	}
	// Another marker is applied, and the key becomes a string.
	batch.Marker = "i1:5"
	if res, errs = l.Replay(ctx, []store.ReplayBatch{batch}); errs[0] != nil || res[0].Replayed != 3 {
		t.Fatalf("replay: %+v %v, want 3 units replayed", res[0], errs[0])
	}
	if typ := c.Type(ctx, key).Val(); typ != "string" {
		t.Errorf("the replayed key is a %s, want a string", typ)
	}
}
