// Package envoyrls is Envoy's rate limit service (v3,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) in front of
// any ratelimit.Limiter: the service's resilient limiter, so the fallback,
// the journal and the replay hold for Envoy's descriptors as for the HTTP
// routes. Its configuration is envoyproxy/ratelimit's YAML format (Load),
// with a few keys of its own; docs/DOORS.md says where it differs.
//
// Each descriptor a request carries is one ratelimit.Request: the policy of
// the configured descriptor it matches, and as identity a hash of the
// domain and of every key and value of the descriptor (a descriptor
// configured without a value thus limits each value apart, and no client
// value becomes a store key as it is).
package envoyrls

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// Bounds on a request, so that one call cannot ask for unbounded work.
const (
	MaxDescriptors = 64
	MaxEntries     = 32
	MaxEntryBytes  = 1024
)

// Metadata keys the service reads and writes.
const (
	// MetadataRequestID is read from a trusted peer with
	// WithTrustedRequestIDs (nginx's $request_id, Envoy's x-request-id):
	// the sliding window log counts a request id once, so a call resent
	// after a timeout is not counted twice.
	MetadataRequestID = "x-request-id"
	// MetadataServedBy and MetadataMode are response header metadata of
	// WithDebug: the instance and what decided (as X-Served-By and
	// X-RateLimit-Mode on the HTTP routes).
	MetadataServedBy = "x-served-by"
	MetadataMode     = "x-ratelimit-mode"
)

// Service implements pb.RateLimitServiceServer. Build it with New; it is
// safe for concurrent use.
type Service struct {
	pb.UnimplementedRateLimitServiceServer
	limiter  ratelimit.Limiter
	config   atomic.Pointer[Config]
	headers  bool
	debug    bool
	instance string
	trusted  []netip.Prefix
	trustIDs bool
	logger   *slog.Logger
	stats    func(Hits)
}

// Option configures a Service.
type Option func(*Service)

// WithResponseHeaders adds the HTTP rate-limit headers of the most
// restrictive descriptor to every answer that has a limited descriptor
// (response_headers_to_add, which Envoy adds to the client's response): the
// IETF RateLimit and RateLimit-Policy, the X-RateLimit trio and, over the
// limit, Retry-After, as on the HTTP routes (httplimit.SetHeaders).
func WithResponseHeaders() Option { return func(s *Service) { s.headers = true } }

// WithDebug sends the instance and the mode of the most restrictive
// decision as response header metadata (x-served-by, x-ratelimit-mode).
func WithDebug(instance string) Option {
	return func(s *Service) { s.debug, s.instance = true, instance }
}

// WithTrustedProxies sets the peers whose x-request-id metadata is believed
// with WithTrustedRequestIDs (default none: every call gets a new id).
func WithTrustedProxies(prefixes []netip.Prefix) Option {
	return func(s *Service) { s.trusted = prefixes }
}

// WithTrustedRequestIDs takes a call's id from the x-request-id metadata
// of a trusted peer (WithTrustedProxies), instead of a new one (the
// default). The limiter counts a call with the id of one admitted moments
// before once (a proxy's resend, see redisstore.WithResendWindow), so turn
// it on only behind a proxy that sets the id itself, overwriting the
// client's (nginx: grpc_set_header x-request-id $request_id); a proxy that
// passes the client's through would let the client repeat one id for
// admissions that are not counted. As httplimit.WithTrustedRequestIDs.
func WithTrustedRequestIDs() Option { return func(s *Service) { s.trustIDs = true } }

// Hits are the hits (hits_addend) of one limited descriptor of one call,
// counted as envoyproxy/ratelimit counts its per-descriptor stats
// (ratelimit.service.rate_limit.<domain>.<descriptor>.*) where the two
// count alike; docs/DOORS.md maps one to the other.
type Hits struct {
	// Domain is the request's domain, one the configuration names.
	Domain string
	// Descriptor is the matched configured descriptor's path
	// (Limit.Descriptor); "override" for a limit override
	// (RateLimitOverride) that matched no configured descriptor.
	Descriptor string
	// Total is every hit: WithinLimit + OverLimit.
	Total uint64
	// WithinLimit counts the hits of an admitted call, OverLimit those of
	// a refused one (a call is admitted or refused whole: a refusal counts
	// nothing), shadow-mode descriptors' included.
	WithinLimit, OverLimit uint64
	// NearLimit counts the admitted hits that took the descriptor's count
	// past envoyproxy/ratelimit's near-limit threshold, floor(0.8 ×
	// capacity): a part of WithinLimit.
	NearLimit uint64
	// ShadowMode counts the hits over the limit of a shadow_mode
	// descriptor, answered OK: a part of OverLimit.
	ShadowMode uint64
}

// WithStats calls record with the Hits of every limited descriptor of
// every call decided (none for an unknown domain, a descriptor that
// matches no configured one, an unlimited or replaced one, a call that
// fails). record is called on the call's goroutine: it must be quick and
// safe for concurrent use.
func WithStats(record func(Hits)) Option { return func(s *Service) { s.stats = record } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Service) { s.logger = l } }

// New returns a service deciding through limiter with cfg (nil: no domain).
func New(limiter ratelimit.Limiter, cfg *Config, opts ...Option) *Service {
	s := &Service{limiter: limiter, logger: slog.Default()}
	for _, o := range opts {
		o(s)
	}
	s.SetConfig(cfg)
	return s
}

// SetConfig replaces the configuration (nil: no domain): the calls that
// follow are decided by it, and calls in progress finish with the one they
// started with (ShouldRateLimit reads it once). A descriptor configured
// alike in both keeps its policy name, so its counts carry over; so does
// one whose rate changed but not its unit, algorithm or unit_multiplier
// (the store keys state by the policy's name, algorithm and window, which
// leave the limit out); one whose unit or algorithm changed starts afresh. Safe for
// concurrent use.
func (s *Service) SetConfig(cfg *Config) {
	if cfg == nil {
		cfg = &Config{}
	}
	s.config.Store(cfg)
}

// Config returns the configuration in force.
func (s *Service) Config() *Config { return s.config.Load() }

// Register registers the service on a gRPC server.
func (s *Service) Register(g *grpc.Server) { pb.RegisterRateLimitServiceServer(g, s) }

// check is one descriptor of a call: what limits it, and its request to the
// limiter (index into the batch, -1: none).
type check struct {
	limit    *Limit
	policy   ratelimit.Policy
	rl       *pb.RateLimitResponse_RateLimit
	hits     uint64
	at       int  // in the batch
	over     bool // refused whatever the limiter says: blocked, or too many hits
	readOnly bool // asked without counting: a read, or too many hits
	tooMany  bool // more hits than the policy ever admits at once
}

// ShouldRateLimit decides every descriptor of the request (in one batch
// when the limiter takes batches) and answers as envoyproxy/ratelimit does:
// a descriptor no configured one matches is OK with no limit, one that is
// unlimited OK with the largest remaining, any descriptor over its limit
// makes the overall code OVER_LIMIT. hits_addend counts per descriptor
// (its own, else the request's, else 1); a descriptor's hits_addend of 0
// only reads, and is over the limit when nothing is left.
func (s *Service) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	if len(descs) > MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "more than %d descriptors", MaxDescriptors)
	}
	cfg := s.config.Load()
	id := s.requestID(ctx)
	checks := make([]check, len(descs))
	replaced := map[string]bool{}
	for i, d := range descs {
		es := d.GetEntries()
		if len(es) > MaxEntries {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: more than %d entries", i, MaxEntries)
		}
		entries := make([]entry, len(es))
		for j, e := range es {
			if len(e.GetKey()) > MaxEntryBytes || len(e.GetValue()) > MaxEntryBytes {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: a key or value longer than %d bytes", i, MaxEntryBytes)
			}
			entries[j] = entry{e.GetKey(), e.GetValue()}
		}
		c := &checks[i]
		c.at = -1
		lim, known := cfg.lookup(req.GetDomain(), entries)
		if o := d.GetLimit(); o != nil && known {
			var err error
			if lim, err = override(req.GetDomain(), lim, o); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
			}
		}
		c.limit = lim
		if lim != nil {
			for _, r := range lim.Replaces {
				replaced[r] = true
			}
		}
		c.hits = uint64(max(1, req.GetHitsAddend()))
		if h := d.GetHitsAddend(); h != nil {
			c.hits = h.GetValue()
		}
	}

	var reqs []ratelimit.Request
	for i := range checks {
		c := &checks[i]
		l := c.limit
		if l != nil && !l.Unlimited && l.Name != "" && replaced[l.Name] {
			l, c.limit = nil, nil // replaced by another descriptor's limit
		}
		if l == nil || l.Unlimited {
			continue
		}
		c.rl, c.policy = l.RateLimit, l.Policy
		capacity := l.Policy.Capacity()
		switch {
		case l.Block:
			c.over = true
		default:
			// More than the policy ever admits at once is over the limit
			// and counts nothing; a read reports the descriptor as it is
			// (duration_until_reset, the headers).
			c.tooMany = c.hits > uint64(capacity)
			c.over = c.tooMany
			c.readOnly = c.hits == 0 || c.tooMany
			r := ratelimit.Request{Policy: l.Policy, Key: identity(req.GetDomain(), descs[i]), ReadOnly: c.readOnly,
				ID: id + "." + strconv.Itoa(i)}
			if !c.readOnly {
				r.Cost = int64(c.hits)
			}
			c.at = len(reqs)
			reqs = append(reqs, r)
		}
	}
	ds, errs := ratelimit.DecideAll(ctx, s.limiter, reqs)
	for j, err := range errs {
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		s.logger.LogAttrs(ctx, slog.LevelError, "rate limiter failed", slog.String("request_id", id),
			slog.String("policy", reqs[j].Policy.Name), slog.String("error", err.Error()))
		return nil, status.Error(codes.Unavailable, "the rate limiter could not decide")
	}
	return s.answer(ctx, req.GetDomain(), checks, ds), nil
}

// identity is the limiter key of a descriptor: a hash of the domain and of
// every key and value, each length-prefixed so no two descriptors share one.
func identity(domain string, d *rlv3.RateLimitDescriptor) string {
	h := sha256.New()
	var n [8]byte
	write := func(s string) {
		l := uint64(len(s))
		for i := range n {
			n[i] = byte(l >> (8 * i))
		}
		_, _ = h.Write(n[:])
		_, _ = h.Write([]byte(s))
	}
	write(domain)
	for _, e := range d.GetEntries() {
		write(e.GetKey())
		write(e.GetValue())
	}
	return "rls:" + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// override is the limit a descriptor's own limit (RateLimitOverride, set by
// Envoy's route configuration) asks for in a known domain: its rate and
// unit, with the algorithm and failure mode of the configured descriptor it
// matched (the default ones when none). Overrides of one domain share the
// policy name "<domain>.override" (names appear in metrics); the
// fingerprint of the parameters keeps their state apart.
func override(domain string, base *Limit, o *rlv3.RateLimitDescriptor_RateLimitOverride) (*Limit, error) {
	u, ok := overrideUnits[o.GetUnit()]
	if !ok {
		return nil, errors.New("the limit override has no valid unit")
	}
	multiplier := uint32(1)
	if m := o.GetUnitMultiplier(); m != nil {
		multiplier = max(1, m.GetValue())
	}
	l := &Limit{RateLimit: &pb.RateLimitResponse_RateLimit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: units[u].unit}, Descriptor: "override"}
	if base != nil {
		l.Descriptor = base.Descriptor
	}
	if multiplier > 1 {
		l.RateLimit.UnitMultiplier = o.GetUnitMultiplier()
	}
	l.Policy = ratelimit.Policy{Name: policyName(domain + ".override"), Algorithm: DefaultAlgorithm,
		Limit: int64(o.GetRequestsPerUnit()), Window: units[u].length * time.Duration(multiplier)}
	if base != nil && !base.Unlimited && !base.Block {
		l.Policy.Algorithm, l.Policy.FailureMode = base.Policy.Algorithm, base.Policy.FailureMode
	}
	if l.Policy.Limit == 0 {
		l.Block = true
		return l, nil
	}
	if err := l.Policy.Validate(); err != nil {
		return nil, err
	}
	return l, nil
}

var overrideUnits = map[typev3.RateLimitUnit]string{
	typev3.RateLimitUnit_SECOND: "second", typev3.RateLimitUnit_MINUTE: "minute", typev3.RateLimitUnit_HOUR: "hour",
	typev3.RateLimitUnit_DAY: "day", typev3.RateLimitUnit_MONTH: "month",
	typev3.RateLimitUnit_YEAR: "year",
}

// requestID returns the call's id: a trusted peer's x-request-id with
// WithTrustedRequestIDs, else a new one.
func (s *Service) requestID(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && s.trustIDs && s.isTrusted(p.Addr) {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if v := md.Get(MetadataRequestID); len(v) == 1 && httplimit.ValidRequestID(v[0]) {
				return v[0]
			}
		}
	}
	return httplimit.NewRequestID()
}

func (s *Service) isTrusted(a net.Addr) bool {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return false
	}
	addr := ap.Addr().Unmap()
	for _, p := range s.trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}
