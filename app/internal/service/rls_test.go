package service

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/redistest"
)

// TestRateLimitServiceRequestIDs: the rate limit service takes a trusted
// proxy's x-request-id as the call's id only with RL_TRUST_REQUEST_ID, the
// rule of the HTTP routes (TestRequestIDTrustedOnlyWhenAsked). Without it,
// one id sent three times from a trusted proxy (loopback, the default
// RL_TRUSTED_PROXIES) counts three times; with it, once (Redis takes the
// repeats for resends of an admitted call).
func TestRateLimitServiceRequestIDs(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n"+
		"    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window_log}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, trust := range []bool{false, true} {
		redis := redistest.StartServer(t, redistest.ServerOptions{})
		env := map[string]string{"RL_GRPC_ADDR": "127.0.0.1:0", "RL_RLS_CONFIG_DIR": dir, "RL_REDIS_URL": "redis://" + redis.Addr() + "/0"}
		if trust {
			env["RL_TRUST_REQUEST_ID"] = "true"
		}
		s, _ := startServer(t, env)
		conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		c := pb.NewRateLimitServiceClient(conn)
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-request-id", "resent-1")
		req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
		var remaining []uint32
		for range 3 {
			r, err := c.ShouldRateLimit(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			remaining = append(remaining, r.Statuses[0].LimitRemaining)
		}
		want := []uint32{9, 8, 7}
		if trust {
			want = []uint32{9, 9, 9}
		}
		if remaining[0] != want[0] || remaining[1] != want[1] || remaining[2] != want[2] {
			t.Errorf("RL_TRUST_REQUEST_ID=%v: one request id three times left %v, want %v", trust, remaining, want)
		}
	}
}

// TestRateLimitServiceEmptyConfigDir: a configuration directory without a
// YAML file stops the start, naming the directory, instead of answering
// OK to every call.
func TestRateLimitServiceEmptyConfigDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("the files went elsewhere\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(envOf(map[string]string{"RL_GRPC_ADDR": "127.0.0.1:0", "RL_RLS_CONFIG_DIR": dir}))
	if want := "RL_RLS_CONFIG_DIR: " + dir + ": no configuration file"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %v, want one starting %q", err, want)
	}
}
