package loadtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// RLSPrefix starts a route served by Envoy's rate limit service (v3,
// ShouldRateLimit) instead of HTTP: "rls:<domain>/<descriptor key>". Each key
// of such a route sends one descriptor of the domain, {<descriptor key>:
// <key name>}, so a descriptor configured without a value limits each key
// apart, as an API key does on the HTTP routes. OVER_LIMIT is recorded as
// status 429, OK as 200, a failed call as 0 (the gRPC status in Error).
const RLSPrefix = "rls:"

// IsRLSRoute reports whether route is served by the rate limit service.
func IsRLSRoute(route string) bool { return strings.HasPrefix(route, RLSPrefix) }

// rlsRoute splits a route "rls:<domain>/<key>".
func rlsRoute(route string) (domain, key string, err error) {
	domain, key, ok := strings.Cut(strings.TrimPrefix(route, RLSPrefix), "/")
	if !IsRLSRoute(route) || !ok || domain == "" || key == "" || strings.Contains(key, "/") {
		return "", "", fmt.Errorf("loadtest: route %q: want %s<domain>/<descriptor key>", route, RLSPrefix)
	}
	return domain, key, nil
}

// Metadata of the rate limit service's answers (as the HTTP headers
// X-Request-Id, X-Served-By and X-RateLimit-Mode).
const (
	mdRequestID = "x-request-id"
	mdServedBy  = "x-served-by"
	mdMode      = "x-ratelimit-mode"
)

// rlsTimeout bounds one call, as the HTTP client's timeout bounds a request.
const rlsTimeout = 2 * time.Second

// RLSClient calls a rate limit service (plaintext gRPC, loopback only). It
// is safe for concurrent use; one connection carries every call (HTTP/2).
type RLSClient struct {
	conn   *grpc.ClientConn
	client pb.RateLimitServiceClient
}

// DialRLS returns a client of the rate limit service at addr (host:port,
// a loopback address, localhost, or an address AllowTarget allowed). The
// connection is made at the first call.
func DialRLS(addr string) (*RLSClient, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("loadtest: rate limit service address: %w", err)
	}
	if ip, err := netip.ParseAddr(host); !strings.EqualFold(host, "localhost") && (err != nil || !allowedTarget(ip)) {
		return nil, fmt.Errorf("loadtest: rate limit service %q: only loopback targets (127.0.0.0/8, ::1, localhost) are allowed", addr)
	}
	d := loopbackDialer()
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		return nil, fmt.Errorf("loadtest: rate limit service %s: %w", addr, err)
	}
	return &RLSClient{conn: conn, client: pb.NewRateLimitServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *RLSClient) Close() error { return c.conn.Close() }

// request is the call of key name on route.
func rlsRequest(route, name string) (*pb.RateLimitRequest, error) {
	domain, key, err := rlsRoute(route)
	if err != nil {
		return nil, err
	}
	return &pb.RateLimitRequest{Domain: domain, HitsAddend: 1, Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: name}},
	}}}, nil
}

// ShouldRateLimit makes one call of key name on route and returns the
// answer with its header metadata. A call that fails UNAVAILABLE is made
// once more, as a client of a fleet configures it (Envoy's
// grpc_service.retry_policy, docs/DOORS.md): a proxy in front of the
// instances (the stack's nginx) resends a call that found an instance
// gone only until it has sent it, since it does not buffer a gRPC body,
// so a call in flight to an instance that crashes fails with a 502, which
// gRPC reads as UNAVAILABLE, and only the client can resend it.
func (c *RLSClient) ShouldRateLimit(ctx context.Context, route, name string) (*pb.RateLimitResponse, metadata.MD, error) {
	req, err := rlsRequest(route, name)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, rlsTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		var md metadata.MD
		resp, err := c.client.ShouldRateLimit(ctx, req, grpc.Header(&md))
		if attempt < rlsAttempts && status.Code(err) == codes.Unavailable && ctx.Err() == nil {
			continue
		}
		return resp, md, err
	}
}

// rlsAttempts bounds the attempts of one call (see ShouldRateLimit).
const rlsAttempts = 2

// send makes one call of key k and records it, as send does a request.
func (c *RLSClient) send(ctx context.Context, k Key, now func() time.Time) Record {
	rec := Record{Route: k.Route, Key: k.Name, Class: k.Class}
	t0 := now()
	resp, md, err := c.ShouldRateLimit(ctx, k.Route, k.Name)
	elapsed := now().Sub(t0)
	switch {
	case err != nil:
		rec.Error = err.Error()
	case resp.GetOverallCode() == pb.RateLimitResponse_OK:
		rec.Status = 200
	case resp.GetOverallCode() == pb.RateLimitResponse_OVER_LIMIT:
		rec.Status = 429
	default:
		rec.Status, rec.Error = 500, "overall code "+resp.GetOverallCode().String()
	}
	first := func(k string) string {
		if v := md.Get(k); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	rec.RequestID, rec.Instance, rec.Mode = first(mdRequestID), first(mdServedBy), first(mdMode)
	t1 := t0.Add(elapsed)
	rec.TSendMS, rec.TRecvMS = UnixMS(t0), UnixMS(t1)
	rec.LatencyMS = math.Round(float64(elapsed.Microseconds())) / 1000
	return rec
}

// Learn makes one call of key name on route and returns the policy of its
// descriptor: from the RateLimit-Policy header the service adds when asked
// to (RL_RLS_RESPONSE_HEADERS), else from the status's current limit
// (requests_per_unit per unit × unit_multiplier).
func (c *RLSClient) Learn(ctx context.Context, route, name string) (Policy, error) {
	resp, _, err := c.ShouldRateLimit(ctx, route, name)
	if err != nil {
		return Policy{}, fmt.Errorf("learn %s: %w", route, err)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), "RateLimit-Policy") {
			p, err := ParsePolicyHeader(h.GetValue())
			if err != nil {
				return Policy{}, fmt.Errorf("learn %s: %w", route, err)
			}
			return p, nil
		}
	}
	if len(resp.GetStatuses()) != 1 || resp.GetStatuses()[0].GetCurrentLimit() == nil {
		return Policy{}, fmt.Errorf("learn %s: the descriptor has no limit (%v)", route, resp)
	}
	l := resp.GetStatuses()[0].GetCurrentLimit()
	unit, ok := unitLengths[l.GetUnit()]
	if !ok || l.GetRequestsPerUnit() == 0 {
		return Policy{}, fmt.Errorf("learn %s: limit %v: no usable rate", route, l)
	}
	if m := l.GetUnitMultiplier(); m != nil && m.GetValue() > 1 {
		unit *= time.Duration(m.GetValue())
	}
	return Policy{Quota: int64(l.GetRequestsPerUnit()), Window: unit}, nil
}

var unitLengths = map[pb.RateLimitResponse_RateLimit_Unit]time.Duration{
	pb.RateLimitResponse_RateLimit_SECOND: time.Second,
	pb.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	pb.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	pb.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	pb.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
	pb.RateLimitResponse_RateLimit_MONTH:  30 * 24 * time.Hour,
	pb.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
}

// errNoRLS: a route of the rate limit service without a client for it.
var errNoRLS = errors.New("loadtest: a route of the rate limit service (" + RLSPrefix + "...) needs an RLS client (Config.RLS, -rls)")
