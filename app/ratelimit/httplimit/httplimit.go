// Package httplimit is net/http middleware that applies rate-limit policies
// through any ratelimit.Limiter and answers as the project's HTTP contract
// says: IETF RateLimit / RateLimit-Policy headers (draft-ietf-httpapi-
// ratelimit-headers, revision 11 syntax), the X-RateLimit-* trio, 429 with
// Retry-After and an RFC 9457 problem body, 400 for unusable client input.
//
// It depends only on net/http: any router that takes a
// func(http.Handler) http.Handler works (chi, http.ServeMux, gorilla).
//
// # Identity
//
// By default a request is counted under the X-API-Key header when present
// ("k:<key>"), otherwise under the client IP ("ip:<addr>", IPv6 grouped by
// /64). The prefixes keep the two spaces apart: an API key that looks like
// an address never shares a counter with that address. The client IP is the
// direct peer (RemoteAddr) unless the peer is a trusted proxy
// (Config.TrustedProxies); then X-Real-IP is used when it holds an untrusted
// address, else the rightmost untrusted hop of X-Forwarded-For. A proxy in
// front must therefore overwrite X-Real-IP (nginx:
// proxy_set_header X-Real-IP $remote_addr) and append to X-Forwarded-For
// ($proxy_add_x_forwarded_for); a client can then not pick its identity.
// Keys go to the limiter as they are (with "{...}" and all); the stores hash
// them before they become part of a store key.
//
// # Request ids
//
// Every request gets an id: the X-Request-Id response header, the problem
// body's request_id, the log lines, and ratelimit.Request.ID for the
// limiter, which takes a request with the id of one it admitted moments
// before for a proxy's resend and does not count it again. So the id is an
// idempotency key, and by default the middleware makes a new one for every
// request. Config.TrustedRequestIDs takes it from a trusted proxy's
// X-Request-Id instead (the proxy must overwrite the client's); an outer
// middleware can set its own with ContextWithRequestID. Whoever chooses
// the ids can make two requests count as one: never pass a client's choice
// through.
//
// # Several policies
//
// Handler takes one or more policies. Every policy is decided for every
// request, in order, each counting it (as Envoy's descriptors do): a request
// refused by one policy still uses the units the others granted. The request
// is refused when any enforced (non-shadow) policy refuses. The headers
// describe one policy, the most restrictive: a refusing policy before an
// admitting one; among refusing ones the longest RetryAfter (so Retry-After
// is the wait until every policy admits); among admitting ones the fewest
// Remaining, then the longest ResetAfter, then the first given. Shadow
// policies are left out of that choice unless every policy is a shadow.
//
// # Shadow policies
//
// A policy with Shadow set is decided and counted like any other, and a
// refusal is logged ("shadow policy would refuse"), but it never refuses.
//
// # Errors
//
// A key the limiter cannot use (ratelimit.ErrInvalidRequest: empty,
// over-long, control characters; or a cost above the capacity) gets a 400
// problem; a key refused by the API-key check (Config.APIKeys) a 401
// problem. Any other error from the limiter goes to Config.OnError. The
// default fails open and logs at error level: the project's resilient limiter decides locally
// when its store is out, so an error reaching the middleware means a
// misconfiguration (a raw store wired without the resilient layer, an
// invalid policy), and answering 5xx for it would turn a limiter problem
// into an outage. The middleware never answers 5xx itself.
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/contract"
)

const (
	contentTypeProblem = "application/problem+json"
	maxRequestIDBytes  = 128
)

// Identity prefixes of the default key function. An API key may be at most
// ratelimit.MaxKeyBytes - len(APIKeyPrefix) bytes.
const (
	APIKeyPrefix = "k:"
	IPPrefix     = "ip:"
)

// ErrInvalidAPIKey is returned (wrapped) by a key function for a credential
// that is present but refused; the middleware answers 401.
var ErrInvalidAPIKey = errors.New("invalid API key")

// Middleware applies rate-limit policies to HTTP requests. Build it with New;
// it is safe for concurrent use, and one Middleware can make handlers for
// any number of routes with Handler.
type Middleware struct {
	limiter  ratelimit.Limiter
	keyFunc  func(r *http.Request, p ratelimit.Policy) (string, error) // nil: API key or client IP
	trusted  []netip.Prefix
	check    func(ctx context.Context, key string) (string, error)
	perAddr  map[string]bool // policy names counted per client address
	instance string
	debug    bool
	trustIDs bool // X-Request-Id from a trusted proxy is the request's id
	logger   *slog.Logger
	onError  func(w http.ResponseWriter, r *http.Request, p ratelimit.Policy, err error) bool
	cost     func(*http.Request) int64
}

// Config configures a Middleware. The zero Config is the default.
type Config struct {
	// KeyFunc, when set, returns the identity under which policy p counts
	// request r, instead of the default identity (X-API-Key, else client
	// IP; see the package documentation). An error wrapping
	// ErrInvalidAPIKey gets a 401 problem; any other error a 400 problem
	// (the key function reads client input). The returned key must be 1 to
	// ratelimit.MaxKeyBytes bytes with no control character, or the
	// request gets a 400. Taking the policy lets one route count per API
	// key under one policy and per IP under another; ClientIP and IPKey
	// are the building blocks. APIKeys and PerAddress are part of the
	// default identity and do not apply to a KeyFunc.
	KeyFunc func(r *http.Request, p ratelimit.Policy) (string, error)
	// APIKeys checks the X-API-Key header for the default identity: it
	// returns the identity the key stands for (counted as "k:" + id), or
	// an error for a key it refuses. A refused key creates no state under
	// the key: the request counts against the per-address policies only
	// (PerAddress), and gets a 401 problem, or the 429 of a per-address
	// policy that refuses it. Without a check every well-formed key is its
	// own identity, and any client can pick as many identities as it
	// likes: pair that with a per-address policy.
	APIKeys func(ctx context.Context, key string) (id string, err error)
	// PerAddress names the policies that count per client address ("ip:"
	// + the client IP, see ClientIP) whatever the API key, as a ceiling
	// over all the keys one address uses. A route's handler decides its
	// per-address and per-key policies together (in one round trip when
	// the limiter is a ratelimit.BatchLimiter).
	PerAddress []string
	// TrustedProxies are the networks whose X-Real-IP and X-Forwarded-For
	// headers are believed (invalid prefixes are skipped), and whose
	// X-Request-Id is with TrustedRequestIDs. The default is none: the
	// client IP is the direct peer.
	TrustedProxies []netip.Prefix
	// TrustedRequestIDs takes a request's id from the X-Request-Id header
	// when the direct peer is a trusted proxy, instead of generating one
	// (the default). The limiter counts a request with the id of one
	// admitted moments before once (a proxy's resend to another instance,
	// see redisstore.Config.ResendWindow), so turn it on only behind a
	// proxy that sets the header itself, overwriting whatever the client
	// sent (nginx: proxy_set_header X-Request-Id $request_id). A proxy that
	// passes the client's header through would let the client repeat one
	// id for admissions that are not counted.
	TrustedRequestIDs bool
	// Cost returns the units a request takes (default 1; less than 1
	// counts as 1). A cost above the capacity of any of the route's
	// policies gets a 400 before any policy counts it.
	Cost func(*http.Request) int64
	// OnError handles an error from the limiter for policy p (anything but
	// ratelimit.ErrInvalidRequest, which always gets a 400). Returning
	// true proceeds as if p had admitted the request (reported with mode
	// "open"); returning false stops, and the handler must have written a
	// response. The default logs and fails open (see the package
	// documentation).
	OnError func(w http.ResponseWriter, r *http.Request, p ratelimit.Policy, err error) (proceed bool)
	// Logger is the middleware's logger (default slog.Default()).
	Logger *slog.Logger
	// ServedBy, when set, adds X-Served-By: ServedBy and X-RateLimit-Mode
	// (what decided: redis, local, open, closed, memory) to every response.
	ServedBy string
}

// New returns a Middleware deciding through limiter. It panics if limiter is
// nil.
func New(limiter ratelimit.Limiter, cfg Config) *Middleware {
	if limiter == nil {
		panic("httplimit: nil limiter")
	}
	m := &Middleware{
		limiter:  limiter,
		keyFunc:  cfg.KeyFunc,
		check:    cfg.APIKeys,
		perAddr:  make(map[string]bool, len(cfg.PerAddress)),
		trusted:  make([]netip.Prefix, 0, len(cfg.TrustedProxies)),
		trustIDs: cfg.TrustedRequestIDs,
		cost:     cfg.Cost,
		onError:  cfg.OnError,
		logger:   cfg.Logger,
		instance: cfg.ServedBy,
		debug:    cfg.ServedBy != "",
	}
	for _, n := range cfg.PerAddress {
		m.perAddr[n] = true
	}
	for _, p := range cfg.TrustedProxies {
		if p.IsValid() {
			m.trusted = append(m.trusted, p.Masked())
		}
	}
	if m.logger == nil {
		m.logger = slog.Default()
	}
	if m.onError == nil {
		m.onError = m.failOpen
	}
	return m
}

// Handler returns middleware that applies the policies to every request
// (see the package documentation for how several policies combine). It
// panics when no policy is given, a policy is invalid or two share a name:
// policies are configuration, checked once at start.
func (m *Middleware) Handler(policies ...ratelimit.Policy) func(http.Handler) http.Handler {
	if len(policies) == 0 {
		panic("httplimit: Handler needs at least one policy")
	}
	compiled := make([]compiledPolicy, len(policies))
	for i, p := range policies {
		if err := p.Validate(); err != nil {
			panic("httplimit: " + err.Error())
		}
		for _, q := range policies[:i] {
			if q.Name == p.Name {
				panic(fmt.Sprintf("httplimit: policy %q given twice", p.Name))
			}
		}
		compiled[i] = compile(p)
		compiled[i].perAddress = m.perAddr[p.Name]
	}
	minCapacity := compiled[0].capacity
	for _, cp := range compiled[1:] {
		minCapacity = min(minCapacity, cp.capacity)
	}
	return func(next http.Handler) http.Handler {
		h := &handler{m: m, policies: compiled, minCapacity: minCapacity, next: next}
		for _, cp := range compiled {
			h.perAddress = h.perAddress || cp.perAddress
		}
		return h
	}
}

// failOpen is the default Config.OnError.
func (m *Middleware) failOpen(_ http.ResponseWriter, r *http.Request, p ratelimit.Policy, err error) bool {
	id, _ := RequestIDFromContext(r.Context())
	m.logger.LogAttrs(r.Context(), slog.LevelError, "rate limiter failed; failing open",
		slog.String("request_id", id), slog.String("policy", p.Name), slog.String("error", err.Error()))
	return true
}

// handler applies one route's compiled policies.
type handler struct {
	m           *Middleware
	policies    []compiledPolicy
	minCapacity int64
	perAddress  bool // some policy counts per client address
	next        http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	peer := peerAddr(r)
	peerTrusted := m.isTrusted(peer)
	id, inContext := m.requestIDOf(r, peerTrusted)
	if !inContext {
		r = r.WithContext(ContextWithRequestID(r.Context(), id))
	}
	ctx := r.Context()
	hdr := w.Header()
	setHeader(hdr, keyRequestID, id)
	if m.debug {
		setHeader(hdr, keyServedBy, m.instance)
	}

	var key, addr string
	var refused error // the API key was refused: only per-address policies count
	if m.keyFunc == nil {
		var err error
		if key, addr, err = m.identities(r, peer, peerTrusted); err != nil {
			if !errors.Is(err, ErrInvalidAPIKey) || !h.perAddress {
				m.rejectKey(w, r, id, err)
				return
			}
			refused = err
		}
	}
	cost := int64(1)
	if m.cost != nil {
		// Checked against every policy before any decides, so that a cost
		// one policy cannot take is not counted by the others.
		if cost = max(m.cost(r), 1); cost > h.minCapacity {
			writeProblem(w, r, id, http.StatusBadRequest, problemInvalidRequest, "Bad Request",
				"the request costs more than a policy's capacity ("+itoa(h.minCapacity)+")", 0, "")
			return
		}
	}

	n := len(h.policies)
	reqs := make([]ratelimit.Request, 0, n)
	which := make([]int, 0, n) // reqs[j] is for h.policies[which[j]]
	for i := range h.policies {
		cp := &h.policies[i]
		k := key
		switch {
		case m.keyFunc != nil:
			var err error
			if k, err = m.keyFunc(r, cp.policy); err == nil {
				err = contract.ValidateKey(k)
			}
			if err != nil {
				m.rejectKey(w, r, id, err)
				return
			}
		case cp.perAddress:
			k = addr
		case refused != nil:
			continue
		}
		reqs = append(reqs, ratelimit.Request{Policy: cp.policy, Key: k, Cost: cost, ID: id})
		which = append(which, i)
	}
	ds, errs := ratelimit.DecideAll(ctx, m.limiter, reqs)

	best, shadow := -1, -1
	counted := true
	for j, i := range which {
		cp := &h.policies[i]
		if err := errs[j]; err != nil {
			if errors.Is(err, ratelimit.ErrInvalidRequest) {
				writeProblem(w, r, id, http.StatusBadRequest, problemInvalidRequest, "Bad Request",
					"the request cannot be rate limited: "+err.Error(), 0, cp.policy.Name)
				return
			}
			if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
				// The client went away before its request was decided:
				// it is not served, and its going is no store failure
				// to fail open on (TestClientGoneRunsNoHandler).
				m.logger.LogAttrs(ctx, slog.LevelDebug, "client gone before the decision",
					slog.String("request_id", id), slog.String("policy", cp.policy.Name))
				return
			}
			if !m.onError(w, r, cp.policy, err) {
				return
			}
			ds[j] = ratelimit.Decision{Allowed: true, Limit: cp.capacity, Remaining: cp.capacity, Mode: ratelimit.ModeOpen}
		}
		if ds[j].Mode == ratelimit.ModeOpen && !cp.policy.Shadow {
			counted = false
		}
		d := ds[j]
		if cp.policy.Shadow {
			if !d.Allowed {
				m.logger.LogAttrs(ctx, slog.LevelInfo, "shadow policy would refuse",
					slog.String("request_id", id), slog.String("policy", cp.policy.Name),
					slog.String("mode", string(d.Mode)), slog.Duration("retry_after", d.RetryAfter))
			}
			if shadow < 0 || moreRestrictive(d, ds[shadow]) {
				shadow = j
			}
			continue
		}
		if best < 0 || moreRestrictive(d, ds[best]) {
			best = j
		}
	}
	enforced := true
	if best < 0 { // every policy is a shadow: report the dry run, never refuse
		best, enforced = shadow, false
		ds[best].Allowed = true
	}
	if refused != nil && ds[best].Allowed {
		m.rejectKey(w, r, id, refused)
		return
	}
	h.writeHeaders(hdr, which, ds, best, enforced)
	bestD, cp := ds[best], &h.policies[which[best]]
	if !bestD.Allowed {
		retry := retryAfterSeconds(bestD.RetryAfter)
		setHeader(hdr, keyRetryAfter, itoa(retry))
		m.logger.LogAttrs(ctx, slog.LevelDebug, "rate limited",
			slog.String("request_id", id), slog.String("policy", cp.policy.Name),
			slog.String("mode", string(bestD.Mode)), slog.Int64("retry_after_s", retry))
		writeProblem(w, r, id, http.StatusTooManyRequests, problemRateLimited, "Too Many Requests",
			cp.detail+itoa(retry)+" s.", retry, cp.policy.Name)
		return
	}
	h.next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, countedKey{}, counted)))
}

type countedKey struct{}

// Counted reports whether every policy of the route counted the request
// that the handler serves (ok: the request went through the middleware).
// It is false when a policy let the request through uncounted: its store
// failed and Config.OnError failed open, or its failure mode is open
// while the store is out. A handler with side effects can refuse them
// then.
func Counted(ctx context.Context) (counted, ok bool) {
	counted, ok = ctx.Value(countedKey{}).(bool)
	return counted, ok
}

// rejectKey answers a request whose identity is unusable.
func (m *Middleware) rejectKey(w http.ResponseWriter, r *http.Request, id string, err error) {
	if errors.Is(err, ErrInvalidAPIKey) {
		m.logger.LogAttrs(r.Context(), slog.LevelInfo, "API key refused",
			slog.String("request_id", id), slog.String("error", err.Error()))
		writeProblem(w, r, id, http.StatusUnauthorized, problemInvalidAPIKey, "Unauthorized",
			"the X-API-Key header holds no valid API key", 0, "")
		return
	}
	m.logger.LogAttrs(r.Context(), slog.LevelDebug, "unusable client identity",
		slog.String("request_id", id), slog.String("error", err.Error()))
	writeProblem(w, r, id, http.StatusBadRequest, problemInvalidRequest, "Bad Request", err.Error(), 0, "")
}

// moreRestrictive reports whether decision a is more restrictive than b (see
// the package documentation).
func moreRestrictive(a, b ratelimit.Decision) bool {
	if a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if !a.Allowed {
		return a.RetryAfter > b.RetryAfter
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}
