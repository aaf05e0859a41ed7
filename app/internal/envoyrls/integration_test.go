package envoyrls_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fleetlimit/fleetlimit/app/internal/envoyrls"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redisstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redistest"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// clock is the store's clock in these tests: fixed, moved by hand, so that
// no window turns over during a case and time passes without sleeping.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// rls is a service under test: a real redis-server, the resilient limiter
// over the Redis store as the service deploys it, the gRPC server on a
// loopback port and a client of it.
type rls struct {
	svc    *envoyrls.Service
	client pb.RateLimitServiceClient
	redis  *redistest.Server
	lim    *resilient.Limiter
}

// startRLS starts a service on the configuration in dir; a non-nil clk is
// the store's clock.
func startRLS(t *testing.T, dir string, clk *clock, opts ...envoyrls.Option) *rls {
	t.Helper()
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, PoolSize: 8,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = rc.Close() })
	var storeCfg redisstore.Config
	if clk != nil {
		storeCfg.Clock = clk.Now
	}
	lim, err := resilient.New(redisstore.New(rc, storeCfg), resilient.Config{
		// Timeouts far above a decision's time even under -race on a busy
		// host: a call that timed out would be decided locally, and the
		// tests count what Redis decided.
		Instance: "rls-test", Timeout: time.Second, ProbeInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close(context.Background()) })
	cfg, err := envoyrls.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	svc := envoyrls.New(lim, cfg, opts...)
	g := grpc.NewServer()
	svc.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &rls{svc: svc, client: pb.NewRateLimitServiceClient(conn), redis: srv, lim: lim}
}

// request builds a request: descriptors of "key=value" entries separated by
// commas, e.g. request("another", 1, "key2=a", "key3=a").
func request(domain string, hits uint32, descriptors ...string) *pb.RateLimitRequest {
	r := &pb.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for _, d := range descriptors {
		desc := &rlv3.RateLimitDescriptor{}
		for kv := range strings.SplitSeq(d, ",") {
			k, v, _ := strings.Cut(kv, "=")
			desc.Entries = append(desc.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		r.Descriptors = append(r.Descriptors, desc)
	}
	return r
}

// withHits sets the descriptors' own hits_addend.
func withHits(r *pb.RateLimitRequest, hits ...uint64) *pb.RateLimitRequest {
	for i, h := range hits {
		r.Descriptors[i].HitsAddend = wrapperspb.UInt64(h)
	}
	return r
}

func limit(rpu uint32, unit pb.RateLimitResponse_RateLimit_Unit) *pb.RateLimitResponse_RateLimit {
	return &pb.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit}
}

// ok and over are a limited descriptor's statuses.
func ok(l *pb.RateLimitResponse_RateLimit, remaining uint32) *pb.RateLimitResponse_DescriptorStatus {
	return &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK, CurrentLimit: l, LimitRemaining: remaining}
}

func over(l *pb.RateLimitResponse_RateLimit) *pb.RateLimitResponse_DescriptorStatus {
	return &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OVER_LIMIT, CurrentLimit: l}
}

// unmatched is the status of a descriptor that matched no limit.
var unmatched = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}

func response(code pb.RateLimitResponse_Code, statuses ...*pb.RateLimitResponse_DescriptorStatus) *pb.RateLimitResponse {
	return &pb.RateLimitResponse{OverallCode: code, Statuses: statuses}
}

// call sends req and compares the answer with want, headers aside (see
// wantHeaders). A limited status must carry a duration until reset within
// [0, bound] (0: the whole capacity is there); the comparison takes it from
// the answer.
func (s *rls) call(t *testing.T, req *pb.RateLimitRequest, want *pb.RateLimitResponse, bound time.Duration) *pb.RateLimitResponse {
	t.Helper()
	got, err := s.client.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	want = proto.Clone(want).(*pb.RateLimitResponse)
	for i, st := range got.GetStatuses() {
		if i >= len(want.Statuses) || want.Statuses[i].CurrentLimit == nil {
			continue
		}
		d := st.GetDurationUntilReset().AsDuration()
		if st.GetDurationUntilReset() == nil || d < 0 || d > bound {
			t.Errorf("status %d: duration until reset %v, want within [0, %v]", i, st.GetDurationUntilReset(), bound)
		}
		want.Statuses[i].DurationUntilReset = st.GetDurationUntilReset()
	}
	headers := got.ResponseHeadersToAdd
	got.ResponseHeadersToAdd = nil
	defer func() { got.ResponseHeadersToAdd = headers }()
	if !proto.Equal(got, want) {
		t.Fatalf("ShouldRateLimit(%v):\n got %v\nwant %v", req, got, want)
	}
	return got
}

var (
	second = pb.RateLimitResponse_RateLimit_SECOND
	minute = pb.RateLimitResponse_RateLimit_MINUTE
	hour   = pb.RateLimitResponse_RateLimit_HOUR
	day    = pb.RateLimitResponse_RateLimit_DAY
	okCode = pb.RateLimitResponse_OK
	overCd = pb.RateLimitResponse_OVER_LIMIT
)

// TestIntegration runs the request and response cases of envoyproxy/
// ratelimit's integration tests (testBasicBaseConfig, testConfigReload)
// against a real redis-server through a real gRPC client, with their
// configuration rewritten in testdata/integration. Their expectations hold
// as they are: the default algorithm, the sliding window counter, agrees
// with their fixed window on every count within a window.
func TestIntegration(t *testing.T) {
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC)}
	s := startRLS(t, "testdata/integration", clk)

	t.Run("unknown domain", func(t *testing.T) {
		s.call(t, request("foo", 1, "hello=world"), response(okCode, unmatched), 0)
	})
	t.Run("one descriptor, 50 a second", func(t *testing.T) {
		s.call(t, request("basic", 1, "key1=foo"), response(okCode, ok(limit(50, second), 49)), 2*time.Second)
	})
	t.Run("over the limit after 20 a minute", func(t *testing.T) {
		for i := range 25 {
			want := response(okCode, ok(limit(20, minute), uint32(19-i)))
			if i >= 20 {
				want = response(overCd, over(limit(20, minute)))
			}
			s.call(t, request("another", 1, "key2=random-1"), want, 2*time.Minute)
		}
	})
	t.Run("two descriptors of one domain", func(t *testing.T) {
		// Each descriptor counts on its own: key2 goes on counting while
		// key3 refuses, and the overall code is OVER_LIMIT once key3 is.
		for i := range 15 {
			want := response(okCode, ok(limit(20, minute), uint32(19-i)), ok(limit(10, hour), uint32(9-i)))
			if i >= 10 {
				want = response(overCd, ok(limit(20, minute), uint32(19-i)), over(limit(10, hour)))
			}
			s.call(t, request("another", 1, "key2=random-2", "key3=random-2"), want, 2*time.Hour)
		}
	})
	t.Run("duration until reset decreases", func(t *testing.T) {
		first := s.call(t, request("another", 1, "key4=durTest"), response(okCode, ok(limit(20, day), 19)), 48*time.Hour)
		clk.advance(2 * time.Second)
		second := s.call(t, request("another", 1, "key4=durTest"), response(okCode, ok(limit(20, day), 18)), 48*time.Hour)
		d1, d2 := first.Statuses[0].DurationUntilReset.AsDuration(), second.Statuses[0].DurationUntilReset.AsDuration()
		if d2 != d1-2*time.Second {
			t.Fatalf("duration until reset %v, then %v two seconds later", d1, d2)
		}
	})
	t.Run("reload", func(t *testing.T) {
		s.call(t, request("reload", 1, "block=foo"), response(okCode, unmatched), 0)
		s.svc.SetConfig(loadDirs(t, "testdata/integration", "testdata/reload"))
		s.call(t, request("reload", 1, "key1=foo"), response(okCode, ok(limit(50, second), 49)), 2*time.Second)
		// requests_per_unit 0: every request is over the limit.
		s.call(t, request("reload", 1, "block=foo"), response(overCd, over(limit(0, second))), time.Second)
		s.call(t, request("reload", 1, "one_per_minute=foo"), response(okCode, ok(limit(1, minute), 0)), 2*time.Minute)
		s.call(t, request("reload", 1, "one_per_minute=foo"), response(overCd, over(limit(1, minute))), 2*time.Minute)
	})
}

// loadDirs loads the configuration files of several directories as one.
func loadDirs(t *testing.T, dirs ...string) *envoyrls.Config {
	t.Helper()
	var names []string
	var data [][]byte
	for _, d := range dirs {
		files, err := filepath.Glob(filepath.Join(d, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			names, data = append(names, f), append(data, b)
		}
	}
	cfg, err := envoyrls.Parse(names, data)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestHitsAddend: hits_addend counts at the request's level and per
// descriptor; a descriptor's 0 only reads (over the limit once nothing is
// left); more than the limit at once is over it and counts nothing.
func TestHitsAddend(t *testing.T) {
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC)}
	s := startRLS(t, "testdata/integration", clk)
	l := limit(50, second)
	s.call(t, request("basic", 5, "key1=a"), response(okCode, ok(l, 45)), 2*time.Second)
	s.call(t, request("basic", 46, "key1=a"), response(overCd, over(l)), 2*time.Second)
	s.call(t, request("basic", 45, "key1=a"), response(okCode, ok(l, 0)), 2*time.Second)

	s.call(t, request("basic", 51, "key1=b"), response(overCd, over(l)), 2*time.Second)
	s.call(t, request("basic", 1, "key1=b"), response(okCode, ok(l, 49)), 2*time.Second)

	// Read-only next to a counted descriptor: the read takes nothing.
	for i := range 3 {
		s.call(t, withHits(request("basic", 1, "key1=c", "key1=b"), 0, 1), response(okCode, ok(l, 50), ok(l, uint32(48-i))), 2*time.Second)
	}
	s.call(t, withHits(request("basic", 0, "key1=c"), 49), response(okCode, ok(l, 1)), 2*time.Second)
	s.call(t, withHits(request("basic", 7, "key1=c"), 0), response(okCode, ok(l, 1)), 2*time.Second)
	s.call(t, withHits(request("basic", 0, "key1=c"), 1), response(okCode, ok(l, 0)), 2*time.Second)
	s.call(t, withHits(request("basic", 0, "key1=c"), 0), response(overCd, over(l)), 2*time.Second)
}

// TestFeatures: unlimited, replaces, shadow_mode, a limit override, our
// keys, the response headers and the debug metadata.
func TestFeatures(t *testing.T) {
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC)}
	s := startRLS(t, "testdata/integration", clk, envoyrls.WithResponseHeaders(), envoyrls.WithDebug("rls-1"),
		envoyrls.WithTrustedProxies([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}), envoyrls.WithTrustedRequestIDs())

	t.Run("unlimited", func(t *testing.T) {
		want := response(okCode, &pb.RateLimitResponse_DescriptorStatus{Code: okCode, LimitRemaining: math.MaxUint32})
		for range 3 {
			s.call(t, request("features", 1, "unlimited=a"), want, 0)
		}
	})
	t.Run("replaces", func(t *testing.T) {
		vip := &pb.RateLimitResponse_RateLimit{Name: "vip", RequestsPerUnit: 1000, Unit: minute}
		tenant := &pb.RateLimitResponse_RateLimit{Name: "tenant_limit", RequestsPerUnit: 1, Unit: minute}
		for i := range 3 {
			s.call(t, request("features", 1, "tenant=a", "vip=a"), response(okCode, unmatched, ok(vip, uint32(999-i))), 2*time.Minute)
		}
		// Alone, the tenant's limit applies, and was not counted above.
		s.call(t, request("features", 1, "tenant=a"), response(okCode, ok(tenant, 0)), 2*time.Minute)
		s.call(t, request("features", 1, "tenant=a"), response(overCd, over(tenant)), 2*time.Minute)
	})
	t.Run("shadow mode", func(t *testing.T) {
		s.call(t, request("features", 1, "shadow=a"), response(okCode, ok(limit(1, minute), 0)), 2*time.Minute)
		for range 2 {
			s.call(t, request("features", 1, "shadow=a"), response(okCode, &pb.RateLimitResponse_DescriptorStatus{
				Code: okCode, CurrentLimit: limit(1, minute)}), 2*time.Minute)
		}
	})
	t.Run("limit override", func(t *testing.T) {
		req := request("features", 1, "anything=a")
		req.Descriptors[0].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
		s.call(t, req, response(okCode, ok(limit(2, hour), 1)), 2*time.Hour)
		s.call(t, req, response(okCode, ok(limit(2, hour), 0)), 2*time.Hour)
		s.call(t, req, response(overCd, over(limit(2, hour))), 2*time.Hour)
		unknown := request("nowhere", 1, "anything=a")
		unknown.Descriptors[0].Limit = req.Descriptors[0].Limit
		s.call(t, unknown, response(okCode, unmatched), 0)
	})
	t.Run("request ids count once", func(t *testing.T) {
		exact := &pb.RateLimitResponse_RateLimit{RequestsPerUnit: 3, Unit: second, UnitMultiplier: wrapperspb.UInt32(10)}
		ctx := metadata.AppendToOutgoingContext(context.Background(), envoyrls.MetadataRequestID, "resent-1")
		for range 3 {
			got, err := s.client.ShouldRateLimit(ctx, request("features", 1, "exact=a"))
			if err != nil {
				t.Fatal(err)
			}
			if st := got.Statuses[0]; st.Code != okCode || st.LimitRemaining != 2 {
				t.Fatalf("the same request id again: %v, want OK with 2 remaining (counted once)", got)
			}
		}
		s.call(t, request("features", 1, "exact=a"), response(okCode, ok(exact, 1)), 20*time.Second)
	})
	t.Run("headers and metadata", func(t *testing.T) {
		var hdr metadata.MD
		got, err := s.client.ShouldRateLimit(context.Background(), request("features", 1, "headers=a", "unlimited=a"), grpc.Header(&hdr))
		if err != nil {
			t.Fatal(err)
		}
		wantHeaders(t, got, map[string]string{
			"RateLimit-Policy": `"features.headers";q=2;w=60`, "RateLimit": `"features.headers";r=1;t=90`,
			"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "90",
		})
		if by, mode := hdr.Get(envoyrls.MetadataServedBy), hdr.Get(envoyrls.MetadataMode); len(by) != 1 || by[0] != "rls-1" || len(mode) != 1 || mode[0] != "redis" {
			t.Fatalf("metadata %v, want x-served-by rls-1 and x-ratelimit-mode redis", hdr)
		}
		s.call(t, request("features", 1, "headers=a"), response(okCode, ok(limit(2, minute), 0)), 2*time.Minute)
		got, err = s.client.ShouldRateLimit(context.Background(), request("features", 1, "headers=a"))
		if err != nil {
			t.Fatal(err)
		}
		wantHeaders(t, got, map[string]string{
			"RateLimit-Policy": `"features.headers";q=2;w=60`, "RateLimit": `"features.headers";r=0;t=90`,
			"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "90", "Retry-After": "60",
		})
		// Nothing limited, nothing to say.
		if got := s.call(t, request("features", 1, "unlimited=b"), response(okCode, &pb.RateLimitResponse_DescriptorStatus{Code: okCode, LimitRemaining: math.MaxUint32}), 0); len(got.ResponseHeadersToAdd) != 0 {
			t.Fatalf("headers %v for an unlimited descriptor", got.ResponseHeadersToAdd)
		}
	})
	t.Run("invalid requests", func(t *testing.T) {
		many := request("features", 1)
		for i := range envoyrls.MaxDescriptors + 1 {
			many.Descriptors = append(many.Descriptors, request("", 0, fmt.Sprintf("k=%d", i)).Descriptors...)
		}
		for _, req := range []*pb.RateLimitRequest{request("", 1, "key1=a"), request("basic", 1), many} {
			if _, err := s.client.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("%d descriptors in domain %q: %v, want InvalidArgument", len(req.Descriptors), req.Domain, err)
			}
		}
	})
}

// wantHeaders compares response_headers_to_add with want.
func wantHeaders(t *testing.T, r *pb.RateLimitResponse, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, h := range r.GetResponseHeadersToAdd() {
		got[h.GetKey()] = h.GetValue()
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("response headers %v, want %v", got, want)
	}
}

// TestRedisDown: the descriptors are decided by the resilient limiter, so
// while Redis is down they are decided from the local share (mode local),
// and nothing fails.
func TestRedisDown(t *testing.T) {
	s := startRLS(t, "testdata/integration", nil, envoyrls.WithDebug("rls-1"))
	var hdr metadata.MD
	if _, err := s.client.ShouldRateLimit(context.Background(), request("another", 1, "key2=down"), grpc.Header(&hdr)); err != nil {
		t.Fatal(err)
	}
	if m := hdr.Get(envoyrls.MetadataMode); len(m) != 1 || m[0] != "redis" {
		t.Fatalf("mode %v with Redis up, want redis", m)
	}
	s.redis.Kill()
	admitted := 0
	var last *pb.RateLimitResponse
	for range 30 {
		got, err := s.client.ShouldRateLimit(context.Background(), request("another", 1, "key2=down"), grpc.Header(&hdr))
		if err != nil {
			t.Fatalf("with Redis down: %v", err)
		}
		if m := hdr.Get(envoyrls.MetadataMode); len(m) != 1 || m[0] != "local" && m[0] != "redis" {
			t.Fatalf("mode %v with Redis down", m)
		}
		if got.OverallCode == okCode {
			admitted++
		}
		last = got
	}
	// One instance alone holds the whole quota: 19 left after the first.
	if admitted != 19 || last.OverallCode != overCd {
		t.Fatalf("admitted %d of 30 with Redis down (last %v), want the 19 left", admitted, last)
	}
	if st := s.lim.Status(); st.LocalGrants == 0 {
		t.Fatalf("status %+v: no local grant journaled", st)
	}
}
