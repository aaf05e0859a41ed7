package loadtest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fakeRLS imitates the stack's rate limit service: a per-value fixed window
// of one second, the policy header, the debug metadata of four instances.
type fakeRLS struct {
	pb.UnimplementedRateLimitServiceServer
	quota int
	mu    sync.Mutex
	seen  map[string]int
	n     atomic.Int64
}

func (f *fakeRLS) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	n := f.n.Add(1)
	e := req.GetDescriptors()[0].GetEntries()[0]
	f.mu.Lock()
	ck := fmt.Sprintf("%s|%s|%s|%d", req.GetDomain(), e.GetKey(), e.GetValue(), time.Now().Unix())
	f.seen[ck]++
	count := f.seen[ck]
	f.mu.Unlock()
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-served-by", fmt.Sprintf("app%d", n%4+1), "x-ratelimit-mode", "redis",
		"x-request-id", fmt.Sprintf("rls-%d", n)))
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, ResponseHeadersToAdd: []*corev3.HeaderValue{
		{Key: "RateLimit-Policy", Value: fmt.Sprintf(`"%s.%s";q=%d;w=1`, req.GetDomain(), e.GetKey(), f.quota)}}}
	if count > f.quota {
		resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
	}
	return resp, nil
}

func startFakeRLS(t *testing.T, f pb.RateLimitServiceServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(g, f)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

// TestRunThroughTheRateLimitService: a route of the rate limit service is
// learned from its policy header and loaded with the same mix, each key one
// descriptor value; OK is recorded as 200, OVER_LIMIT as 429, with the
// instance, mode and request id of the answer's metadata.
func TestRunThroughTheRateLimitService(t *testing.T) {
	f := &fakeRLS{quota: 10, seen: map[string]int{}}
	rls, err := DialRLS(startFakeRLS(t, f))
	if err != nil {
		t.Fatal(err)
	}
	defer rls.Close()
	const route = "rls:chaos/gcra"
	var (
		mu   sync.Mutex
		recs []Record
	)
	res, err := Run(context.Background(), Config{
		BaseURL: "http://127.0.0.1:1", Routes: []string{route}, RLS: rls, RunID: "t1", Seed: 1, Duration: time.Second,
		OnRecord: func(r Record) {
			mu.Lock()
			recs = append(recs, r)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if p := res.Policies[route]; p.Name != "chaos.gcra" || p.Quota != 10 || p.Window != time.Second {
		t.Fatalf("learned %+v", p)
	}
	instances := map[string]bool{}
	perKey := map[string]int{}
	for _, r := range recs {
		if r.Status != 200 && r.Status != 429 {
			t.Fatalf("record %+v: unexpected status", r)
		}
		if r.Route != route || !strings.HasPrefix(r.RequestID, "rls-") || r.Mode != "redis" || !strings.Contains(r.Key, "-rls-gcra-") {
			t.Fatalf("record %+v: missing fields", r)
		}
		instances[r.Instance] = true
		perKey[r.Key]++
	}
	if len(perKey) != 9 || len(instances) != 4 {
		t.Fatalf("%d keys from %d instances, want 9 keys from 4", len(perKey), len(instances))
	}
	if res.ByStatus[200] == 0 || res.ByStatus[429] == 0 {
		t.Fatalf("statuses %v: want both OK and OVER_LIMIT", res.ByStatus)
	}
}

// failingRLS fails every other call with code, or every call (always):
// UNAVAILABLE is what nginx's 502 reads as, for a call that was in flight
// to an instance that died.
type failingRLS struct {
	pb.UnimplementedRateLimitServiceServer
	code   codes.Code
	always bool
	calls  atomic.Int64
}

func (f *failingRLS) ShouldRateLimit(context.Context, *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if f.calls.Add(1)%2 == 1 || f.always {
		return nil, status.Error(f.code, "failed")
	}
	return &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK}, nil
}

// TestRLSCallResentOnceWhenUnavailable: a call that fails UNAVAILABLE is
// made once more (ShouldRateLimit), and recorded by its answer; not a
// third time; a call that fails otherwise is not resent.
func TestRLSCallResentOnceWhenUnavailable(t *testing.T) {
	for _, tt := range []struct {
		code   codes.Code
		always bool
		calls  int64
		status int
	}{
		{codes.Unavailable, false, 2, 200},
		{codes.Unavailable, true, 2, 0},
		{codes.Internal, false, 1, 0},
	} {
		f := &failingRLS{code: tt.code, always: tt.always}
		rls, err := DialRLS(startFakeRLS(t, f))
		if err != nil {
			t.Fatal(err)
		}
		rec := rls.send(context.Background(), Key{Route: "rls:chaos/gcra", Name: "k"}, time.Now)
		_ = rls.Close()
		if rec.Status != tt.status || f.calls.Load() != tt.calls {
			t.Errorf("%v (always %v): record %+v after %d calls: want status %d after %d", tt.code, tt.always, rec, f.calls.Load(), tt.status, tt.calls)
		}
	}
}

func TestRLSRoutesNeedAClient(t *testing.T) {
	_, err := Run(context.Background(), Config{BaseURL: "http://127.0.0.1:1", Routes: []string{"rls:d/k"}, Duration: time.Second})
	if err != errNoRLS {
		t.Fatalf("error %v, want %v", err, errNoRLS)
	}
	if _, err := DialRLS("192.0.2.1:8090"); err == nil {
		t.Fatal("a client of a non-loopback address")
	}
	for _, r := range []string{"rls:", "rls:d", "rls:/k", "rls:d/", "rls:d/k/x"} {
		if _, _, err := rlsRoute(r); err == nil {
			t.Errorf("route %q accepted", r)
		}
	}
}
