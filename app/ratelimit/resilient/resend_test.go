package resilient_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/reqid"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// TestResendIsNotRefusedFromTheCache: a proxy resends a request whose
// instance failed after Redis admitted it, to another instance whose cache
// holds a refusal of the key. Redis answers the resend as admitted (it is
// not counted again); the cache must not refuse it, while it goes on
// refusing other requests of the key without a round trip.
func TestResendIsNotRefusedFromTheCache(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	ls := startInstances(t, srv.Addr())
	a, b := ls[0], ls[1]
	ctx := context.Background()
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.SlidingWindowLog} {
		t.Run(string(alg), func(t *testing.T) {
			p := ratelimit.Policy{Name: "resend-" + string(alg), Algorithm: alg, Limit: 3, Window: time.Hour}
			decide := func(l *resilient.Limiter, id string) contract.Decision {
				t.Helper()
				d, err := decideWire(ctx, l, ratelimit.Request{Policy: p, Key: "k", ID: id})
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			// nginx's ids (32 hex digits), which Redis keeps in short form
			// (reqid.Short): the refusal's hint is r3's short form.
			r1, r2, r3 := reqid.Random(), reqid.Random(), reqid.Random()
			for _, id := range []string{r1, r2, r3} {
				if d := decide(a, id); !d.Allowed || d.Mode != ratelimit.ModeRedis {
					t.Fatalf("%s on a: %+v, want admitted by Redis", id, d)
				}
			}
			if d := decide(b, "x"); d.Allowed || d.ResendID != reqid.Short(r3) {
				t.Fatalf("x on b: %+v, want refused by Redis with the hint r3", d)
			}
			cached := b.Status().CachedRefusals
			if d := decide(b, "y"); d.Allowed || b.Status().CachedRefusals != cached+1 {
				t.Fatalf("y on b: %+v, cached refusals %d -> %d; want refused from the cache", d, cached, b.Status().CachedRefusals)
			}
			// The resend of r3 reaches Redis, which admits it uncounted.
			if d := decide(b, r3); !d.Allowed || d.Mode != ratelimit.ModeRedis || d.Remaining != 0 {
				t.Fatalf("resent r3 on b: %+v, want admitted by Redis with 0 remaining", d)
			}
			if d := decide(a, "z"); d.Allowed {
				t.Fatalf("z on a after the resend: %+v, want refused (the resend was not counted, nor freed anything)", d)
			}
		})
	}
}
