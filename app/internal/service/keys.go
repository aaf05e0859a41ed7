package service

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/lease"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// keysResponse is the body of GET /admin/keys.
type keysResponse struct {
	Instance string `json:"instance"`
	Key      string `json:"key"`
	// Mode and Breaker as in /status.
	Mode     string      `json:"mode"`
	Breaker  string      `json:"breaker,omitempty"`
	Policies []keyPolicy `json:"policies"`
}

// keyPolicy is the key under one policy.
type keyPolicy struct {
	Policy        string  `json:"policy"`
	Algorithm     string  `json:"algorithm"`
	Limit         int64   `json:"limit"`
	WindowSeconds float64 `json:"window_seconds"`
	// Capacity is what remaining counts down from: the burst of a token
	// bucket or GCRA policy that has one, else the limit.
	Capacity int64 `json:"capacity"`
	Shadow   bool  `json:"shadow,omitempty"`
	// Redis is the key as Redis holds it (Redis mode), Memory as this
	// instance's memory store does (memory mode).
	Redis  *keyCount `json:"redis,omitempty"`
	Memory *keyCount `json:"memory,omitempty"`
	// Local is what this instance holds of the key (Redis mode).
	Local *keyLocal `json:"local,omitempty"`
}

// keyCount is the key in a store: what a request could take now and how
// long until the key is full, or why the store could not say.
type keyCount struct {
	Remaining    *int64   `json:"remaining,omitempty"`
	ResetSeconds *float64 `json:"reset_seconds,omitempty"`
	Error        string   `json:"error,omitempty"`
}

// keyLocal is what this instance holds of the key (resilient.KeyState and
// the lease layer's lease).
type keyLocal struct {
	// Share is the key's local share while this instance decides it
	// locally (fallback).
	Share *keyShare `json:"share,omitempty"`
	// Lease is the lease this instance holds of the key (its units are
	// counted in Redis already).
	Lease *keyLease `json:"lease,omitempty"`
	// RefusedUntil: this instance refuses the key without asking Redis
	// until then (Redis refused it; the retry time is exact).
	RefusedUntil *time.Time `json:"refused_until,omitempty"`
	// Journaled is the units granted locally that Redis does not have yet.
	Journaled int64 `json:"journaled"`
}

type keyShare struct {
	Remaining    int64   `json:"remaining"`
	ResetSeconds float64 `json:"reset_seconds"`
}

type keyLease struct {
	Units int64     `json:"units"`
	Until time.Time `json:"until"`
}

// keys serves GET /admin/keys?key=<k:id or ip:addr>[&policy=<name>]: the
// key's state under each policy it can be limited under (every policy for
// an address; for an API key every policy but the per-address ones), or
// under the one named: in Redis, read with a read-only request that goes
// past every local shortcut, and what this instance holds of it. It counts
// nothing. The key is checked as POST /admin/reset checks it; a bad key, an
// unknown policy or another parameter is a 400 problem.
func (s *Server) keys(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for name, values := range q {
		if name != "key" && name != "policy" || len(values) != 1 {
			badAdminRequest(w, r, "the query is key=<k:API key id or ip:address> and, optionally, policy=<name>, each once")
			return
		}
	}
	identity, err := resetIdentity(q.Get("key"))
	if err != nil {
		badAdminRequest(w, r, err.Error())
		return
	}
	set := s.Policies()
	var policies []ratelimit.Policy
	if name := q.Get("policy"); name != "" {
		p, ok := set.Policy(name)
		if !ok {
			badAdminRequest(w, r, fmt.Sprintf("unknown policy %q", name))
			return
		}
		policies = []ratelimit.Policy{p}
	} else {
		perKey := strings.HasPrefix(identity, httplimit.APIKeyPrefix)
		for _, p := range set.Policies {
			if !perKey || !slices.Contains(set.PerAddress, p.Name) {
				policies = append(policies, p)
			}
		}
	}
	st := s.backend.status()
	out := keysResponse{Instance: s.cfg.Instance, Key: identity, Mode: st.Mode, Breaker: st.Breaker,
		Policies: s.backend.inspect(r.Context(), identity, policies)}
	writeJSON(w, http.StatusOK, out)
}

// newKeyPolicy describes p, with no state yet.
func newKeyPolicy(p ratelimit.Policy) keyPolicy {
	return keyPolicy{Policy: p.Name, Algorithm: string(p.Algorithm), Limit: p.Limit,
		WindowSeconds: p.Window.Seconds(), Capacity: p.Capacity(), Shadow: p.Shadow}
}

// readOnly asks l for identity's state under each policy with read-only
// requests (one round trip to a batching store), which count nothing.
func readOnly(ctx context.Context, l ratelimit.Limiter, identity string, policies []ratelimit.Policy) []keyCount {
	reqs := make([]ratelimit.Request, len(policies))
	for i, p := range policies {
		reqs[i] = ratelimit.Request{Policy: p, Key: identity, ReadOnly: true}
	}
	ds, errs := ratelimit.DecideAll(ctx, l, reqs)
	out := make([]keyCount, len(policies))
	for i := range out {
		if errs[i] != nil {
			out[i].Error = errs[i].Error()
			continue
		}
		remaining, reset := ds[i].Remaining, ds[i].ResetAfter.Seconds()
		out[i].Remaining, out[i].ResetSeconds = &remaining, &reset
	}
	return out
}

// inspectMemory is backend.inspect in memory mode: the memory store holds
// all there is.
func inspectMemory(mem *memstore.Store) func(context.Context, string, []ratelimit.Policy) []keyPolicy {
	return func(ctx context.Context, identity string, policies []ratelimit.Policy) []keyPolicy {
		counts := readOnly(ctx, mem, identity, policies)
		out := make([]keyPolicy, len(policies))
		for i, p := range policies {
			out[i] = newKeyPolicy(p)
			out[i].Memory = &counts[i]
		}
		return out
	}
}

// inspectRedis is backend.inspect in Redis mode. Redis is asked directly
// through the store (st), not through the resilient limiter, whose cached
// refusal, local share or lease would answer instead, and whose breaker
// would count a failure of the read; it is not asked while the breaker is
// open. Then what this instance holds: rl's and leased's state of the key.
func inspectRedis(st ratelimit.Limiter, rl *resilient.Limiter, leased *lease.Limiter, timeout time.Duration) func(context.Context, string, []ratelimit.Policy) []keyPolicy {
	return func(ctx context.Context, identity string, policies []ratelimit.Policy) []keyPolicy {
		var counts []keyCount
		if rl.Breaker() == resilient.BreakerOpen {
			counts = make([]keyCount, len(policies))
			for i := range counts {
				counts[i].Error = "Redis not asked: the breaker is open (Redis is out)"
			}
		} else {
			callCtx, cancel := context.WithTimeout(ctx, timeout)
			counts = readOnly(callCtx, st, identity, policies)
			cancel()
		}
		out := make([]keyPolicy, len(policies))
		for i, p := range policies {
			out[i] = newKeyPolicy(p)
			out[i].Redis = &counts[i]
			ks := rl.Inspect(p, identity)
			local := &keyLocal{Journaled: ks.Journaled}
			if ks.Share != nil {
				local.Share = &keyShare{Remaining: ks.Share.Remaining, ResetSeconds: ks.Share.ResetAfter.Seconds()}
			}
			if !ks.RefusedUntil.IsZero() {
				t := ks.RefusedUntil.UTC()
				local.RefusedUntil = &t
			}
			if p.Lease > 0 {
				if units, until, ok := leased.Inspect(p.Name, identity); ok {
					local.Lease = &keyLease{Units: units, Until: until.UTC()}
				}
			}
			out[i].Local = local
		}
		return out
	}
}
