package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/conformance"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/algorithm"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/vectors"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// newClient returns a client of its own (instances share nothing but Redis).
func newClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 32})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestVectors runs the shared vector table against the Lua twins.
func TestVectors(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	for i, c := range vectors.All() {
		t.Run(c.Name, func(t *testing.T) {
			var now int64
			l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{Clock: func() time.Time { return time.UnixMicro(now) }})
			key := fmt.Sprintf("vector-%d", i)
			for j, s := range c.Steps {
				now = vectors.T0 + s.At
				got, err := l.DecideWire(context.Background(), contract.Request{Request: ratelimit.Request{Policy: c.Policy, Key: key, Cost: s.Cost, ReadOnly: s.ReadOnly, ID: fmt.Sprintf("req-%d", j)}, Weight: s.Weight})
				if err != nil {
					t.Fatal(err)
				}
				want := c.Decision(s)
				want.Mode = ratelimit.ModeRedis
				if got := withoutHint(got); got != want {
					t.Errorf("step %d:\n got %+v\nwant %+v", j, got, want)
				}
			}
		})
	}
}

// withoutHint clears a refusal's resend hint, which TestResendVectors
// checks: the vector tables leave it out.
func withoutHint(d contract.Decision) contract.Decision {
	d.ResendID, d.ResendUntil = "", 0
	return d
}

// TestResendVectors runs the resend table against the Lua scripts, and
// checks that the state keeps the twin's encoding of the last admission
// (algorithm.Admission).
func TestResendVectors(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	for i, rc := range vectors.ResendCases {
		t.Run(rc.Name, func(t *testing.T) {
			var now int64
			l := redisstore.New(c, redisstore.Config{Clock: func() time.Time { return time.UnixMicro(now) }, ResendWindow: time.Duration(rc.Window) * time.Microsecond})
			key := fmt.Sprintf("resend-%d", i)
			var last algorithm.Admission
			for j, s := range rc.Steps {
				now = vectors.T0 + s.At
				d, err := l.DecideWire(context.Background(), contract.Request{Request: ratelimit.Request{Policy: rc.Policy, Key: key, Cost: s.Cost, ID: s.ID}})
				if err != nil {
					t.Fatal(err)
				}
				until := s.ResendUntil
				if until != 0 {
					until += vectors.T0
				}
				if d.Allowed != s.Allowed || d.Remaining != s.Remaining || d.ResendID != s.ResendID || d.ResendUntil != until {
					t.Errorf("step %d (%s at %d): %+v; want allowed %v, remaining %d, hint %q until %d", j, s.ID, s.At, d, s.Allowed, s.Remaining, s.ResendID, until)
				}
				if rc.Policy.Algorithm == ratelimit.SlidingWindowLog {
					continue
				}
				if d.Allowed && !last.Resend(s.ID, now, rc.Window) {
					last = algorithm.Admission{ID: s.ID, At: now}
				}
				f, err := storedAdmission(c, rc.Policy.Algorithm, l.Key(rc.Policy, key))
				// A string state drops an admission past the resend window
				// when it is next written (lua/state.lua).
				dropped := rc.Policy.Algorithm != ratelimit.SlidingWindowCounter && f == "" && !last.Resend(last.ID, now, rc.Window)
				if err != nil || f != last.String() && !dropped {
					t.Errorf("step %d: admission %q (%v), want %q", j, f, err, last.String())
				}
			}
		})
	}
}

// storedAdmission is the last admission a key's state keeps (lua/once.lua):
// field i of the window counter's hash, the part after the two integers of
// the token bucket's and GCRA's string (lua/state.lua).
func storedAdmission(c redis.Cmdable, a ratelimit.Algorithm, key string) (string, error) {
	ctx := context.Background()
	if a == ratelimit.SlidingWindowCounter {
		return c.HGet(ctx, key, "i").Result()
	}
	v, err := c.Get(ctx, key).Result()
	if err != nil {
		return "", err
	}
	parts := strings.SplitN(v, ":", 3)
	if len(parts) < 3 {
		return "", nil
	}
	return parts[2], nil
}

func TestConformance(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	conformance.Run(t, ratelimit.ModeRedis, func(t *testing.T) ratelimit.Limiter {
		return redisstore.New(newClient(t, srv.Addr()), redisstore.Config{})
	})
}

func TestUnexpectedStateIsAnErrorNotAPanic(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	for _, alg := range contract.Algorithms {
		p := ratelimit.Policy{Name: "odd", Algorithm: alg, Limit: 5, Window: time.Minute}
		for name, corrupt := range map[string]func(key string) error{
			"wrong type": func(key string) error {
				if alg == ratelimit.SlidingWindowLog {
					return c.Set(ctx, key, "x", 0).Err()
				}
				return c.RPush(ctx, key, "x").Err()
			},
			"garbage string": func(key string) error {
				return c.Set(ctx, key, "abc:?:1:x", 0).Err()
			},
			"garbage fields": func(key string) error {
				if alg == ratelimit.SlidingWindowLog {
					return c.ZAdd(ctx, key, redis.Z{Score: 1, Member: "m"}).Err() // harmless: old score
				}
				return c.HSet(ctx, key, "t", "abc", "l", "xyz", "r", "?", "w", "nan", "c", "1", "p", "1").Err()
			},
		} {
			t.Run(string(alg)+"/"+name, func(t *testing.T) {
				key := l.Key(p, name)
				if err := c.Del(ctx, key).Err(); err != nil {
					t.Fatal(err)
				}
				if err := corrupt(key); err != nil {
					t.Fatal(err)
				}
				_, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: name})
				if alg == ratelimit.SlidingWindowLog && name == "garbage fields" {
					if err != nil {
						t.Fatalf("an old member is simply expired: %v", err)
					}
					return
				}
				if !errors.Is(err, ratelimit.ErrBadReply) {
					t.Fatalf("error %v, want ErrBadReply", err)
				}
			})
		}
	}
}

func TestEveryKeyHasATTL(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	for _, alg := range contract.Algorithms {
		p := ratelimit.Policy{Name: "ttl", Algorithm: alg, Limit: 5, Window: 10 * time.Second}
		if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"}); err != nil {
			t.Fatal(err)
		}
		ttl, err := c.PTTL(ctx, l.Key(p, "k")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > 21*time.Second+time.Second {
			t.Errorf("%s: TTL %v, want within two windows plus a margin", alg, ttl)
		}
	}
}

// TestScriptsReloadAfterFlush: after FUNCTION FLUSH (as after a restart
// without persistence) a decision loads the library and is decided and
// counted once.
func TestScriptsReloadAfterFlush(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	p := ratelimit.Policy{Name: "flush", Algorithm: ratelimit.GCRA, Limit: 5, Window: time.Minute}
	ctx := context.Background()
	for i := range 3 {
		if i == 1 {
			if err := c.FunctionFlush(ctx).Err(); err != nil { // as after a Redis restart
				t.Fatal(err)
			}
		}
		if d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "k"}); err != nil || d.Remaining != int64(4-i) {
			t.Fatalf("decision %d: %+v %v", i, d, err)
		}
	}
}

func TestSlidingLogCountsARequestIDOnce(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{})
	p := ratelimit.Policy{Name: "ids", Algorithm: ratelimit.SlidingWindowLog, Limit: 3, Window: time.Minute}
	for _, id := range []string{"a", "a", "b", "a", "b"} {
		d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k", ID: id})
		if err != nil || !d.Allowed {
			t.Fatalf("%s: %+v %v", id, d, err)
		}
	}
	d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k", ID: "c"})
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("c: %+v %v, want the third distinct request admitted with 0 left", d, err)
	}
}

func TestUnavailable(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{Timeout: 100 * time.Millisecond})
	p := ratelimit.Policy{Name: "down", Algorithm: ratelimit.TokenBucket, Limit: 5, Window: time.Minute}
	srv.Stop() // hung, not refused
	defer srv.Cont()
	if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"}); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("paused Redis: %v, want ErrUnavailable", err)
	}
	srv.Cont()
	srv.Kill()
	if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k"}); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("killed Redis: %v, want ErrUnavailable", err)
	}
}

// A Redis that refuses writes (maxmemory with noeviction: OOM) is
// unavailable, not a bad reply: the breaker must open on it.
func TestWriteRefusalIsUnavailable(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{Timeout: time.Second})
	for _, alg := range contract.Algorithms {
		p := ratelimit.Policy{Name: "oom-" + string(alg), Algorithm: alg, Limit: 5, Window: time.Minute}
		if _, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "warm"}); err != nil {
			t.Fatal(err)
		}
	}
	admin := srv.Client()
	defer admin.Close()
	if err := admin.ConfigSet(context.Background(), "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.ConfigSet(context.Background(), "maxmemory", "0")
	// Redis checks maxmemory at a script's first write command: a script
	// that starts by trimming (the sliding window log) is let through.
	refused := 0
	for _, alg := range contract.Algorithms {
		p := ratelimit.Policy{Name: "oom-" + string(alg), Algorithm: alg, Limit: 5, Window: time.Minute}
		_, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "new-key"})
		if err == nil {
			continue
		}
		refused++
		if !errors.Is(err, ratelimit.ErrUnavailable) || errors.Is(err, ratelimit.ErrBadReply) {
			t.Errorf("%s under OOM: %v, want ErrUnavailable", alg, err)
		}
	}
	if refused == 0 {
		t.Fatal("no decision was refused under maxmemory 1: the test did not test")
	}
}

// The sliding window log admits a cost of thousands in one call, as its Go
// twin does (Lua 5.1's unpack fails past a few thousand values).
func TestWindowLogLargeCost(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	l := redisstore.New(newClient(t, srv.Addr()), redisstore.Config{Timeout: 5 * time.Second})
	p := ratelimit.Policy{Name: "big", Algorithm: ratelimit.SlidingWindowLog, Limit: 20000, Window: time.Minute}
	d, err := l.Decide(context.Background(), ratelimit.Request{Policy: p, Key: "k", Cost: 12000})
	if err != nil || !d.Allowed || d.Remaining != 8000 {
		t.Fatalf("cost 12000: %+v %v, want allowed with 8000 left", d, err)
	}
}

func BenchmarkDecide(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	for _, alg := range contract.Algorithms {
		b.Run(string(alg), func(b *testing.B) {
			l := redisstore.New(newClient(b, srv.Addr()), redisstore.Config{})
			p := ratelimit.Policy{Name: "bench", Algorithm: alg, Limit: 1_000_000, Window: time.Second}
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: "client-1"}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkDecideConcurrent is 64 goroutines deciding GCRA on distinct keys,
// each call a round trip (coalesce=0) or sharing pipelines with the calls
// made meanwhile (coalesce=4): compare the two with
// benchstat -col /coalesce.
func BenchmarkDecideConcurrent(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	for _, n := range []int{0, 4} {
		b.Run(fmt.Sprint("coalesce=", n), func(b *testing.B) {
			o := srv.Options()
			o.PoolSize = 128
			c := redis.NewClient(o)
			defer c.Close()
			l := redisstore.New(c, redisstore.Config{Coalescing: n, Timeout: time.Second})
			p := ratelimit.Policy{Name: "bench", Algorithm: ratelimit.GCRA, Limit: 1_000_000, Window: time.Second}
			b.ReportAllocs()
			decideInParallel(b, l, p)
		})
	}
}

// TestDecideBatch: a batch counts each request once, in one pipeline,
// with the answers Decide gives; after FUNCTION FLUSH the library is loaded
// again and nothing is counted twice; an invalid request fails alone.
func TestDecideBatch(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	perKey := ratelimit.Policy{Name: "per-key", Algorithm: ratelimit.GCRA, Limit: 3, Window: time.Minute}
	perAddr := ratelimit.Policy{Name: "per-addr", Algorithm: ratelimit.SlidingWindowLog, Limit: 5, Window: time.Minute}
	admitted := map[string]int{}
	for i := range 8 {
		if i == 2 {
			if err := c.FunctionFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		reqs := []ratelimit.Request{
			{Policy: perKey, Key: "k:a"},
			{Policy: perAddr, Key: "ip:192.0.2.1"},
			{Policy: perKey, Key: ""},
		}
		ds, errs := l.DecideBatch(ctx, reqs)
		if !errors.Is(errs[2], ratelimit.ErrInvalidRequest) {
			t.Fatalf("batch %d: empty key: %v, want ErrInvalidRequest", i, errs[2])
		}
		for j := range 2 {
			if errs[j] != nil {
				t.Fatalf("batch %d, request %d: %v", i, j, errs[j])
			}
			if ds[j].Mode != ratelimit.ModeRedis || ds[j].Limit != reqs[j].Policy.Capacity() {
				t.Errorf("batch %d, request %d: %+v", i, j, ds[j])
			}
			if ds[j].Allowed {
				admitted[reqs[j].Policy.Name]++
			}
		}
	}
	if admitted["per-key"] != 3 || admitted["per-addr"] != 5 {
		t.Errorf("admitted %v, want per-key 3 and per-addr 5", admitted)
	}
	// What Redis holds agrees: the log has exactly 5 grants.
	if n, err := c.ZCard(ctx, l.Key(perAddr, "ip:192.0.2.1")).Result(); err != nil || n != 5 {
		t.Errorf("log holds %d grants (%v), want 5", n, err)
	}
}

// TestResentRequestCountsOnce: nginx resends a request whose instance died
// or timed out after deciding it, with the same request id. A request with
// the id of the last admitted one is admitted again without being counted;
// a new id is counted; the sliding window log keys by id already.
func TestResentRequestCountsOnce(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	l := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	for _, alg := range contract.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			p := ratelimit.Policy{Name: "once", Algorithm: alg, Limit: 10, Window: time.Hour}
			key := "k:resent-" + string(alg)
			decide := func(id string) ratelimit.Decision {
				t.Helper()
				d, err := l.Decide(ctx, ratelimit.Request{Policy: p, Key: key, ID: id})
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			first := decide("req-a")
			resent := decide("req-a")
			if !resent.Allowed || resent.Remaining != first.Remaining {
				t.Errorf("resent: allowed %v, remaining %d; want admitted and still %d", resent.Allowed, resent.Remaining, first.Remaining)
			}
			if d := decide("req-b"); !d.Allowed || d.Remaining != first.Remaining-1 {
				t.Errorf("a new request: remaining %d, want %d", d.Remaining, first.Remaining-1)
			}
			// Spend the rest: a resend of the last admitted one is still
			// admitted, a new one refused.
			var last string
			for i := range 20 {
				id := fmt.Sprintf("req-%d", i)
				if decide(id).Allowed {
					last = id
				}
			}
			if d := decide(last); !d.Allowed || d.Remaining != 0 {
				t.Errorf("resend of the last admitted at the limit: %+v, want admitted with 0 remaining", d)
			}
			if d := decide("req-new"); d.Allowed {
				t.Errorf("a new request at the limit was admitted")
			}
		})
	}
}

// A Redis that refuses the client (a password or an ACL that changed, a
// full connection table) is unavailable, not a bad reply: every call meets
// it, so the breaker must open on it and the fallback serve.
func TestClientRefusalIsUnavailable(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{Password: "secret"})
	ctx := context.Background()
	admin := srv.Client()
	if err := admin.Do(ctx, "ACL", "SETUSER", "pinger", "on", ">pw", "~*", "-@all", "+ping", "+hello", "+auth").Err(); err != nil {
		t.Fatal(err)
	}
	p := ratelimit.Policy{Name: "refused", Algorithm: ratelimit.GCRA, Limit: 5, Window: time.Minute}
	cases := []struct {
		name string
		opts redis.Options
	}{
		{"unauthenticated", redis.Options{}},
		{"WRONGPASS", redis.Options{Password: "wrong"}},
		{"NOPERM", redis.Options{Username: "pinger", Password: "pw"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.opts
			o.Addr, o.MaxRetries, o.Protocol = srv.Addr(), -1, 2
			client := redis.NewClient(&o)
			t.Cleanup(func() { _ = client.Close() })
			_, err := redisstore.New(client, redisstore.Config{Timeout: time.Second}).Decide(ctx, ratelimit.Request{Policy: p, Key: "k"})
			if !errors.Is(err, ratelimit.ErrUnavailable) || errors.Is(err, ratelimit.ErrBadReply) {
				t.Fatalf("%v, want ErrUnavailable", err)
			}
			if !strings.Contains(err.Error(), c.name) {
				t.Fatalf("%v: not the refusal the case is about", err)
			}
		})
	}
	t.Run("max clients", func(t *testing.T) {
		if err := admin.ConfigSet(ctx, "maxclients", "1").Err(); err != nil {
			t.Fatal(err)
		}
		defer admin.ConfigSet(ctx, "maxclients", "10000")
		o := srv.Options()
		o.MaxRetries = -1
		client := redis.NewClient(o)
		t.Cleanup(func() { _ = client.Close() })
		_, err := redisstore.New(client, redisstore.Config{Timeout: time.Second}).Decide(ctx, ratelimit.Request{Policy: p, Key: "k"})
		if !errors.Is(err, ratelimit.ErrUnavailable) || errors.Is(err, ratelimit.ErrBadReply) {
			t.Fatalf("%v, want ErrUnavailable", err)
		}
		// Redis answers the refusal and closes: the client sees the
		// reply or the closed connection, whichever it reads first.
	})
}

// TestKeyIsShort: a state key is 28 bytes with the default prefix,
// whatever the policy's name and the identity (so that Redis keeps its
// name in its smallest allocation), and it names its policy: two policies
// that differ in name, algorithm or window have distinct keys for one
// identity, and one that differs in limit or burst only has the same.
func TestKeyIsShort(t *testing.T) {
	l := redisstore.New(nil, redisstore.Config{})
	base := ratelimit.Policy{Name: "per-user", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Hour}
	long := base
	long.Name = strings.Repeat("a-very-long-policy-name-", 8)
	keys := map[string]string{}
	for _, id := range []string{"u", "user-00000001", strings.Repeat("x", 500), "{tag}"} {
		for _, p := range []ratelimit.Policy{base, long} {
			k := l.Key(p, id)
			if len(k) != 28 || !strings.HasPrefix(k, "{rl:") || k[6] != '}' {
				t.Fatalf("key %q (%d bytes) for %q under %q, want 28 bytes starting {rl:XX}", k, len(k), id, p.Name)
			}
			if o, ok := keys[k]; ok {
				t.Fatalf("key %q for both %s and %s", k, o, id+"/"+p.Name)
			}
			keys[k] = id + "/" + p.Name
		}
	}
	same := base
	same.Limit, same.Burst = 99, 120
	if l.Key(same, "u") != l.Key(base, "u") {
		t.Error("a new limit or burst changed the key: usage would not carry over a reload")
	}
	for _, q := range []ratelimit.Policy{
		{Name: "per-user2", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Hour},
		{Name: "per-user", Algorithm: ratelimit.TokenBucket, Limit: 10, Window: time.Hour},
		{Name: "per-user", Algorithm: ratelimit.GCRA, Limit: 10, Window: time.Minute},
	} {
		if l.Key(q, "u") == l.Key(base, "u") {
			t.Errorf("policy %+v shares the key of %+v", q, base)
		}
	}
}
