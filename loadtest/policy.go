package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
)

// Policy is what a route's RateLimit-Policy header says: the policy name,
// its quota (the capacity, for token bucket and GCRA) and its window.
type Policy struct {
	Name   string
	Quota  int64
	Window time.Duration
}

// Rate is the policy's quota per second.
func (p Policy) Rate() float64 {
	if p.Window <= 0 {
		return 0
	}
	return float64(p.Quota) / p.Window.Seconds()
}

// ParsePolicyHeader parses a RateLimit-Policy value of
// draft-ietf-httpapi-ratelimit-headers revision 11: `"name";q=100;w=10`.
// With several policies in the list (comma separated) it returns the first.
// The window defaults to 1 s when w is absent, as the draft says.
func ParsePolicyHeader(v string) (Policy, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return Policy{}, errors.New("ratelimit-policy: empty")
	}
	if !strings.HasPrefix(v, `"`) {
		return Policy{}, fmt.Errorf("ratelimit-policy %q: the item is not a quoted string", v)
	}
	end := strings.IndexByte(v[1:], '"')
	if end < 0 {
		return Policy{}, fmt.Errorf("ratelimit-policy %q: unterminated name", v)
	}
	p := Policy{Name: v[1 : 1+end], Window: time.Second}
	rest := v[2+end:]
	if i := strings.IndexByte(rest, ','); i >= 0 {
		rest = rest[:i]
	}
	for param := range strings.SplitSeq(rest, ";") {
		param = strings.TrimSpace(param)
		if param == "" {
			continue
		}
		name, val, _ := strings.Cut(param, "=")
		switch strings.TrimSpace(name) {
		case "q":
			q, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err != nil || q <= 0 {
				return Policy{}, fmt.Errorf("ratelimit-policy %q: bad q", v)
			}
			p.Quota = q
		case "w":
			w, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err != nil || w <= 0 {
				return Policy{}, fmt.Errorf("ratelimit-policy %q: bad w", v)
			}
			p.Window = time.Duration(w) * time.Second
		}
	}
	if p.Quota == 0 {
		return Policy{}, fmt.Errorf("ratelimit-policy %q: no q", v)
	}
	return p, nil
}

// DemoAPIKeySecret is the secret the demo stacks (make local-up, docker
// compose up) sign API keys with unless RL_API_KEY_SECRET says otherwise.
const DemoAPIKeySecret = "fleetlimit-demo-secret-change-me"

// SignKey returns the X-API-Key value of the key named id: id signed with
// secret (package apikey), or id itself when secret is empty.
func SignKey(secret, id string) (string, error) {
	if secret == "" {
		return id, nil
	}
	v, err := apikey.NewVerifier(secret)
	if err != nil {
		return "", fmt.Errorf("loadtest: key %q: %w", id, err)
	}
	k, err := v.Sign(id)
	if err != nil {
		return "", fmt.Errorf("loadtest: key %q: %w", id, err)
	}
	return k, nil
}

// Learn sends one request to route with the given API key and returns the
// policy its RateLimit-Policy header announces. The key should be one that
// no measured client uses (the request takes one unit of its quota).
func Learn(ctx context.Context, client *http.Client, baseURL, route, key string) (Policy, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+route, nil)
	if err != nil {
		return Policy{}, fmt.Errorf("learn %s: %w", route, err)
	}
	req.Header.Set(HeaderAPIKey, key)
	resp, err := client.Do(req)
	if err != nil {
		return Policy{}, fmt.Errorf("learn %s: %w", route, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
	_ = resp.Body.Close()
	h := resp.Header.Get("RateLimit-Policy")
	if h == "" {
		return Policy{}, fmt.Errorf("learn %s: status %d and no RateLimit-Policy header", route, resp.StatusCode)
	}
	p, err := ParsePolicyHeader(h)
	if err != nil {
		return Policy{}, fmt.Errorf("learn %s: %w", route, err)
	}
	return p, nil
}

// LearnAll learns the policy of every route (see Learn), with probe keys
// named "probe-<short route>-<runID>", signed with secret (see SignKey).
func LearnAll(ctx context.Context, client *http.Client, baseURL string, routes []string, runID, secret string) (map[string]Policy, error) {
	return LearnRoutes(ctx, client, nil, baseURL, routes, runID, secret)
}

// LearnRoutes is LearnAll with the routes of the rate limit service learned
// through rls (RLSClient.Learn; the probe key's name is its descriptor's
// value, unsigned).
func LearnRoutes(ctx context.Context, client *http.Client, rls *RLSClient, baseURL string, routes []string, runID, secret string) (map[string]Policy, error) {
	out := make(map[string]Policy, len(routes))
	for _, r := range routes {
		name := "probe-" + ShortRoute(r) + "-" + runID
		var p Policy
		var err error
		switch {
		case IsRLSRoute(r) && rls == nil:
			return nil, errNoRLS
		case IsRLSRoute(r):
			p, err = rls.Learn(ctx, r, name)
		default:
			var key string
			if key, err = SignKey(secret, name); err == nil {
				p, err = Learn(ctx, client, baseURL, r, key)
			}
		}
		if err != nil {
			return nil, err
		}
		out[r] = p
	}
	return out, nil
}
