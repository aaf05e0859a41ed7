package statekey_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/statekey"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/store"
)

// TestKeysDiffer: the name, the algorithm, the window and the identity each
// make another key; the limit and the burst do not (a key keeps its usage
// across a reload that changes them); the same inputs make the same key.
func TestKeysDiffer(t *testing.T) {
	s := statekey.NewSeeds()
	base := ratelimit.Policy{Name: "api", Algorithm: ratelimit.GCRA, Limit: 100, Burst: 50, Window: time.Minute}
	id := store.IdentityOf("client")
	variants := map[string]statekey.Key{}
	add := func(what string, p ratelimit.Policy, id store.Identity) {
		k := s.Key(p, id)
		for other, ok := range variants {
			if ok == k {
				t.Errorf("%s and %s share a key", what, other)
			}
		}
		variants[what] = k
	}
	add("base", base, id)
	for what, change := range map[string]func(*ratelimit.Policy){
		"name":      func(p *ratelimit.Policy) { p.Name = "api2" },
		"algorithm": func(p *ratelimit.Policy) { p.Algorithm = ratelimit.TokenBucket },
		"window":    func(p *ratelimit.Policy) { p.Window = time.Hour },
	} {
		p := base
		change(&p)
		add(what, p, id)
	}
	add("identity", base, store.IdentityOf("client2"))
	reloaded := base
	reloaded.Limit, reloaded.Burst = 101, 7
	if s.Key(reloaded, id) != variants["base"] {
		t.Error("another limit and burst make another key")
	}
	long := base
	long.Name = strings.Repeat("n", 300) // past the stack buffer
	add("long name", long, id)
	if s.Key(base, id) != variants["base"] || s.Key(long, id) != variants["long name"] {
		t.Error("the same policy and identity made another key")
	}
}

// TestKeyDoesNotAllocate for a policy name of ordinary length.
func TestKeyDoesNotAllocate(t *testing.T) {
	s := statekey.NewSeeds()
	p := ratelimit.Policy{Name: "per-address-ceiling", Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Window: time.Minute}
	id := store.IdentityOf("client")
	if n := testing.AllocsPerRun(100, func() { _ = s.Key(p, id) }); n != 0 {
		t.Errorf("%v allocations per key", n)
	}
}
