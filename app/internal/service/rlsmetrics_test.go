package service

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestRLSHitsMetrics: through real gRPC calls, the rate limit service's
// per-descriptor counters have one series per configured descriptor,
// whatever values the clients send (a key-only descriptor is labelled by
// its key, user_id, never user_id_<value>), and count hits as
// envoyproxy/ratelimit does: within the limit, near it (past 8 of 10,
// floor(0.8 × 10)), over it, and shadow mode (over, answered OK).
func TestRLSHitsMetrics(t *testing.T) {
	dir := t.TempDir()
	config := `domain: shop
descriptors:
  - key: user_id
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: plan
    value: gold
    descriptors:
      - key: user_id
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`
	if err := os.WriteFile(filepath.Join(dir, "shop.yaml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ := startServer(t, map[string]string{"RL_GRPC_ADDR": "127.0.0.1:0", "RL_RLS_CONFIG_DIR": dir})
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewRateLimitServiceClient(conn)
	call := func(hits uint32, entries ...string) *pb.RateLimitResponse {
		t.Helper()
		d := &rlv3.RateLimitDescriptor{}
		for _, kv := range entries {
			k, v, _ := strings.Cut(kv, "=")
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		r, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "shop", HitsAddend: hits, Descriptors: []*rlv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// 25 users, 12 hits each against 10 an hour: 10 within (the 9th and
	// 10th near), 2 over.
	for i := range 25 {
		for range 12 {
			call(1, fmt.Sprintf("user_id=client-%d", i))
		}
	}
	// Nested, 5 an hour (threshold 4): 3, then 2 (1 past 4), then 1 over.
	for i := range 5 {
		for _, h := range []uint32{3, 2, 1} {
			call(h, "plan=gold", fmt.Sprintf("user_id=client-%d", i))
		}
	}
	call(1, "plan=silver", "user_id=client-0") // matches nothing
	call(1, "unknown=x")                       // matches nothing
	// Shadow mode, 2 an hour: 4 users × 3 calls, every one answered OK.
	for i := range 4 {
		for range 3 {
			if r := call(1, fmt.Sprintf("trial=client-%d", i)); r.OverallCode != pb.RateLimitResponse_OK {
				t.Fatalf("shadow mode answered %v", r.OverallCode)
			}
		}
	}

	_, body := get(t, "http://"+s.AdminAddr()+"/metrics")
	var got []string
	for line := range strings.SplitSeq(string(body), "\n") {
		if strings.HasPrefix(line, "ratelimit_rls_") && strings.Contains(line, "_hits_total{") {
			got = append(got, line)
		}
	}
	want := []string{
		`ratelimit_rls_hits_total{descriptor="plan_gold.user_id",domain="shop",result="over_limit"} 5`,
		`ratelimit_rls_hits_total{descriptor="plan_gold.user_id",domain="shop",result="within_limit"} 25`,
		`ratelimit_rls_hits_total{descriptor="trial",domain="shop",result="over_limit"} 4`,
		`ratelimit_rls_hits_total{descriptor="trial",domain="shop",result="within_limit"} 8`,
		`ratelimit_rls_hits_total{descriptor="user_id",domain="shop",result="over_limit"} 50`,
		`ratelimit_rls_hits_total{descriptor="user_id",domain="shop",result="within_limit"} 250`,
		`ratelimit_rls_near_limit_hits_total{descriptor="plan_gold.user_id",domain="shop"} 5`,
		`ratelimit_rls_near_limit_hits_total{descriptor="trial",domain="shop"} 4`,
		`ratelimit_rls_near_limit_hits_total{descriptor="user_id",domain="shop"} 50`,
		`ratelimit_rls_shadow_mode_hits_total{descriptor="plan_gold.user_id",domain="shop"} 0`,
		`ratelimit_rls_shadow_mode_hits_total{descriptor="trial",domain="shop"} 4`,
		`ratelimit_rls_shadow_mode_hits_total{descriptor="user_id",domain="shop"} 0`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("/metrics:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if strings.Contains(string(body), "client-") {
		t.Errorf("/metrics holds a client's value:\n%s", grep(body, "client-"))
	}
}
