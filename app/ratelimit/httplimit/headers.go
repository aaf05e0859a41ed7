package httplimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// Problem types (RFC 9457 "type" members) of the middleware's answers.
const (
	problemRateLimited    = "https://github.com/fleetlimit/fleetlimit/blob/main/docs/problems.md#rate-limited"
	problemInvalidRequest = "https://github.com/fleetlimit/fleetlimit/blob/main/docs/problems.md#invalid-request"
	problemInvalidAPIKey  = "https://github.com/fleetlimit/fleetlimit/blob/main/docs/problems.md#invalid-api-key"
)

// Problem is the RFC 9457 body of a 400, 401 or 429 answer.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Instance is the request path.
	Instance string `json:"instance,omitempty"`
	// RetryAfter repeats the Retry-After header (seconds) on a 429.
	RetryAfter int64 `json:"retry_after,omitempty"`
	// Policy names the policy that refused.
	Policy string `json:"policy,omitempty"`
	// RequestID repeats the X-Request-Id header.
	RequestID string `json:"request_id,omitempty"`
}

// The header names the middleware reads or writes, in canonical form,
// computed once: http.Header.Set and Get canonicalise on every call, which
// allocates for names such as "RateLimit" whose canonical form
// ("Ratelimit") differs.
var (
	keyAPIKey          = http.CanonicalHeaderKey("X-API-Key")
	keyRequestID       = http.CanonicalHeaderKey("X-Request-Id")
	keyRealIP          = http.CanonicalHeaderKey("X-Real-IP")
	keyForwardedFor    = http.CanonicalHeaderKey("X-Forwarded-For")
	keyRateLimit       = http.CanonicalHeaderKey("RateLimit")
	keyRateLimitPolicy = http.CanonicalHeaderKey("RateLimit-Policy")
	keyXLimit          = http.CanonicalHeaderKey("X-RateLimit-Limit")
	keyXRemaining      = http.CanonicalHeaderKey("X-RateLimit-Remaining")
	keyXReset          = http.CanonicalHeaderKey("X-RateLimit-Reset")
	keyRetryAfter      = http.CanonicalHeaderKey("Retry-After")
	keyServedBy        = http.CanonicalHeaderKey("X-Served-By")
	keyMode            = http.CanonicalHeaderKey("X-RateLimit-Mode")
)

// setHeader is h.Set for a key already in canonical form.
func setHeader(h http.Header, key, value string) { h[key] = []string{value} }

// getHeader is h.Get for a key already in canonical form.
func getHeader(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// compiledPolicy holds a policy with the parts of its headers that never
// change, built once by Handler.
type compiledPolicy struct {
	policy   ratelimit.Policy
	capacity int64
	// policyHeader is the whole RateLimit-Policy value: "name";q=100;w=10.
	policyHeader string
	// ratePrefix starts the RateLimit value: "name";r=
	ratePrefix string
	limit      string // X-RateLimit-Limit
	detail     string // 429 detail, up to the retry seconds
	perAddress bool   // counted per client address (Config.PerAddress)
}

func compile(p ratelimit.Policy) compiledPolicy {
	name := strconv.Quote(p.Name) // names are [A-Za-z0-9_.-]: a valid sf-string
	capacity := p.Capacity()
	window := ceilSeconds(p.Window)
	if window < 1 {
		window = 1
	}
	return compiledPolicy{
		policy:       p,
		capacity:     capacity,
		policyHeader: name + ";q=" + itoa(capacity) + ";w=" + itoa(window),
		ratePrefix:   name + ";r=",
		limit:        itoa(capacity),
		detail: "policy " + name + " admits " + itoa(capacity) + " requests per " +
			p.Window.String() + "; retry in ",
	}
}

// writeHeaders sets the rate-limit headers of a request that the route's
// policies which[j] decided as ds[j]. RateLimit-Policy and RateLimit list
// every enforced policy (every shadow one when no policy is enforced), in
// the route's order, as draft-11 allows; the X-RateLimit trio and the mode
// describe ds[best], the most restrictive. Per policy, q is its capacity
// (Limit, or Burst for token_bucket and gcra), w its window rounded up to
// whole seconds (at least 1), r the remaining units and t (=
// X-RateLimit-Reset) the seconds until the full capacity is available
// again (ResetAfter rounded up).
func (h *handler) writeHeaders(hdr http.Header, which []int, ds []ratelimit.Decision, best int, enforced bool) {
	d := ds[best]
	cp := &h.policies[which[best]]
	remaining := itoa(max(d.Remaining, 0))
	reset := itoa(ceilSeconds(d.ResetAfter))
	if len(which) == 1 {
		setHeader(hdr, keyRateLimitPolicy, cp.policyHeader)
		setHeader(hdr, keyRateLimit, cp.ratePrefix+remaining+";t="+reset)
	} else {
		var pol, rate strings.Builder
		for j, i := range which {
			other := &h.policies[i]
			if enforced && other.policy.Shadow {
				continue
			}
			if pol.Len() > 0 {
				pol.WriteString(", ")
				rate.WriteString(", ")
			}
			pol.WriteString(other.policyHeader)
			rate.WriteString(other.ratePrefix + itoa(max(ds[j].Remaining, 0)) + ";t=" + itoa(ceilSeconds(ds[j].ResetAfter)))
		}
		setHeader(hdr, keyRateLimitPolicy, pol.String())
		setHeader(hdr, keyRateLimit, rate.String())
	}
	setHeader(hdr, keyXLimit, cp.limit)
	setHeader(hdr, keyXRemaining, remaining)
	setHeader(hdr, keyXReset, reset)
	if h.m.debug && d.Mode != "" {
		setHeader(hdr, keyMode, string(d.Mode))
	}
}

// writeProblem writes an RFC 9457 problem answer.
func writeProblem(w http.ResponseWriter, r *http.Request, id string, status int, typ, title, detail string, retry int64, policy string) {
	body, err := json.Marshal(Problem{
		Type: typ, Title: title, Status: status, Detail: detail,
		Instance: r.URL.Path, RetryAfter: retry, Policy: policy, RequestID: id,
	})
	if err != nil { // cannot happen: strings and integers only
		body = []byte(`{"type":"about:blank","status":` + strconv.Itoa(status) + `}`)
	}
	h := w.Header()
	h.Set("Content-Type", contentTypeProblem)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// retryAfterSeconds is Retry-After for a refusal: d rounded up to whole
// seconds, at least 1.
func retryAfterSeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }

// ceilSeconds is d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// SetHeaders sets on hdr the rate-limit headers the middleware writes for a
// request that policies decided as ds (one decision per policy, in order):
// RateLimit-Policy and RateLimit listing every enforced policy (every
// shadow one when none is enforced), the X-RateLimit trio of the most
// restrictive decision, and Retry-After when that one refused. It returns
// the index of the most restrictive decision (see the package
// documentation), or -1 when no policy is given. Another door to the same
// decisions (a gRPC service, say) answers with the same headers through it.
// It panics when a policy is invalid.
func SetHeaders(hdr http.Header, policies []ratelimit.Policy, ds []ratelimit.Decision) int {
	if len(policies) == 0 || len(policies) != len(ds) {
		return -1
	}
	h := &handler{m: &Middleware{}, policies: make([]compiledPolicy, len(policies))}
	which := make([]int, len(policies))
	best, shadow := -1, -1
	for i, p := range policies {
		if err := p.Validate(); err != nil {
			panic("httplimit: " + err.Error())
		}
		h.policies[i], which[i] = compile(p), i
		switch {
		case p.Shadow:
			if shadow < 0 || moreRestrictive(ds[i], ds[shadow]) {
				shadow = i
			}
		case best < 0 || moreRestrictive(ds[i], ds[best]):
			best = i
		}
	}
	enforced := best >= 0
	if !enforced {
		best = shadow
	}
	h.writeHeaders(hdr, which, ds, best, enforced)
	if enforced && !ds[best].Allowed {
		setHeader(hdr, keyRetryAfter, itoa(retryAfterSeconds(ds[best].RetryAfter)))
	}
	return best
}
