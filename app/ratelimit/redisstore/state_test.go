package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/vectors"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
)

// TestStateString checks what the token bucket and GCRA leave in Redis:
// one string "<a>:<b>:<µs>:<id>" living until the state no longer
// matters; and that a refusal writes nothing.
func TestStateString(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	now := vectors.T0
	l := redisstore.New(c, redisstore.Config{Clock: func() time.Time { return time.UnixMicro(now) }})
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		p := ratelimit.Policy{Name: "forms", Algorithm: alg, Limit: 10, Window: time.Minute, Burst: 2}
		name := fmt.Sprint(alg)
		key := l.Key(p, name)
		var d contract.Decision
		for i := range 2 {
			var err error
			if d, err = l.DecideWire(ctx, contract.Request{Request: ratelimit.Request{Policy: p, Key: name, ID: fmt.Sprint("id-", i)}}); err != nil || !d.Allowed {
				t.Fatalf("%s: %+v %v, want an admission", name, d, err)
			}
		}
		a, b := d.State.TAT, d.State.TATRem
		if alg == ratelimit.TokenBucket {
			a, b = d.State.Tokens, now
		}
		as, bs := strconv.FormatInt(a, 10), strconv.FormatInt(b, 10)
		adm := strconv.FormatInt(now, 10) + ":id-1"
		typ := c.Type(ctx, key).Val()
		if v, want := c.Get(ctx, key).Val(), as+":"+bs+":"+adm; typ != "string" || v != want {
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
