package contract_test

import (
	"context"
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

type registered struct{}

func (registered) Decide(context.Context, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, nil
}

type plain struct{ registered }

type extension struct{ of *registered }

func init() { contract.Register(func(r *registered) any { return extension{r} }) }

// TestExtension: a limiter of a registered type has its extension; any
// other limiter (one that embeds a registered type among them) is its own.
func TestExtension(t *testing.T) {
	r := &registered{}
	if got, ok := contract.Extension(r).(extension); !ok || got.of != r {
		t.Fatalf("Extension(*registered) = %#v, want its extension", contract.Extension(r))
	}
	p := plain{}
	if got, ok := contract.Extension(p).(plain); !ok || got != p {
		t.Fatalf("Extension(plain) = %#v, want itself", contract.Extension(p))
	}
}

// TestRequestValidate: a hold only for a GCRA request that counts, at most
// the window or the refill time; a weight of at most 1024 with Den <= Num.
func TestRequestValidate(t *testing.T) {
	gcra := ratelimit.Policy{Name: "g", Algorithm: ratelimit.GCRA, Limit: 10, Window: 1e9}
	tb := gcra
	tb.Algorithm = ratelimit.TokenBucket
	for _, c := range []struct {
		name string
		req  contract.Request
		ok   bool
	}{
		{"plain", contract.Request{Request: ratelimit.Request{Policy: gcra, Key: "k"}}, true},
		{"hold", contract.Request{Request: ratelimit.Request{Policy: gcra, Key: "k"}, Hold: 1e6}, true},
		{"hold past the window", contract.Request{Request: ratelimit.Request{Policy: gcra, Key: "k"}, Hold: 2e9}, false},
		{"hold, token bucket", contract.Request{Request: ratelimit.Request{Policy: tb, Key: "k"}, Hold: 1e6}, false},
		{"hold, read-only", contract.Request{Request: ratelimit.Request{Policy: gcra, Key: "k", ReadOnly: true}, Hold: 1e6}, false},
		{"weight", contract.Request{Request: ratelimit.Request{Policy: gcra, Key: "k"}, Weight: contract.Weight{Num: 4, Den: 3}}, true},
		{"weight above one", contract.Request{Request: ratelimit.Request{Policy: gcra, Key: "k"}, Weight: contract.Weight{Num: 3, Den: 4}}, false},
		{"bad key", contract.Request{Request: ratelimit.Request{Policy: gcra, Key: ""}}, false},
	} {
		if err := c.req.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
}
