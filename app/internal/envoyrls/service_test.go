package envoyrls_test

import (
	"context"
	"math"
	"net/netip"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fleetlimit/fleetlimit/app/internal/envoyrls"
)

// TestRequestIDsTrustedOnlyWhenAsked: an x-request-id from a trusted peer
// identifies the call only with WithTrustedRequestIDs (the service's
// RL_TRUST_REQUEST_ID, as on the HTTP routes). A trusted peer alone is not
// enough: a proxy that passes the client's id through would let the client
// repeat it for admissions that are not counted (the resend window).
func TestRequestIDsTrustedOnlyWhenAsked(t *testing.T) {
	loopback := envoyrls.WithTrustedProxies([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")})
	for _, trust := range []bool{false, true} {
		clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC)}
		opts := []envoyrls.Option{loopback}
		if trust {
			opts = append(opts, envoyrls.WithTrustedRequestIDs())
		}
		s := startRLS(t, "testdata/integration", clk, opts...)
		ctx := metadata.AppendToOutgoingContext(context.Background(), envoyrls.MetadataRequestID, "resent-1")
		var remaining []uint32
		for range 3 {
			got, err := s.client.ShouldRateLimit(ctx, request("features", 1, "exact=a"))
			if err != nil {
				t.Fatal(err)
			}
			if got.OverallCode != okCode {
				t.Fatalf("trust %v: %v", trust, got)
			}
			remaining = append(remaining, got.Statuses[0].LimitRemaining)
		}
		want := []uint32{2, 1, 0} // each call counted
		if trust {
			want = []uint32{2, 2, 2} // one call, resent
		}
		if remaining[0] != want[0] || remaining[1] != want[1] || remaining[2] != want[2] {
			t.Errorf("trust %v: one request id three times left %v, want %v", trust, remaining, want)
		}
	}
}

// TestRefusalHeaders: a refusal that no counted decision made (a blocked
// descriptor, hits_addend above the capacity, a read with nothing left)
// gets the headers of the descriptor that refused, with Retry-After, as
// any other refusal does; beside admitted descriptors too.
func TestRefusalHeaders(t *testing.T) {
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC)}
	s := startRLS(t, "testdata/integration", clk, envoyrls.WithResponseHeaders())
	headersLimit := limit(2, minute)
	exact := &pb.RateLimitResponse_RateLimit{RequestsPerUnit: 3, Unit: second, UnitMultiplier: wrapperspb.UInt32(10)}

	t.Run("blocked", func(t *testing.T) {
		got := s.call(t, request("features", 1, "blocked=a"), response(overCd, over(limit(0, minute))), time.Minute)
		wantHeaders(t, got, map[string]string{
			"RateLimit-Policy": `"features.blocked";q=0;w=60`, "RateLimit": `"features.blocked";r=0;t=60`,
			"X-RateLimit-Limit": "0", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60", "Retry-After": "60",
		})
	})
	t.Run("blocked beside an admitted descriptor", func(t *testing.T) {
		got := s.call(t, request("features", 1, "blocked=a", "headers=b"), response(overCd, over(limit(0, minute)), ok(headersLimit, 1)), 2*time.Minute)
		wantHeaders(t, got, map[string]string{
			"RateLimit-Policy":  `"features.blocked";q=0;w=60, "features.headers";q=2;w=60`,
			"RateLimit":         `"features.blocked";r=0;t=60, "features.headers";r=1;t=90`,
			"X-RateLimit-Limit": "0", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60", "Retry-After": "60",
		})
	})
	t.Run("a blocked override of a year", func(t *testing.T) {
		// No valid policy has a window of a year, or a quota of 0.
		req := request("features", 1, "anything=y")
		req.Descriptors[0].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_YEAR}
		got := s.call(t, req, response(overCd, over(limit(0, pb.RateLimitResponse_RateLimit_YEAR))), 365*24*time.Hour)
		wantHeaders(t, got, map[string]string{
			"RateLimit-Policy": `"features.override";q=0;w=31536000`, "RateLimit": `"features.override";r=0;t=31536000`,
			"X-RateLimit-Limit": "0", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "31536000", "Retry-After": "31536000",
		})
	})
	t.Run("hits_addend above the capacity", func(t *testing.T) {
		// Nothing counted: the refused descriptor's two requests are
		// still there, but three never fit: look again in a window.
		got := s.call(t, withHits(request("features", 1, "headers=c", "exact=c"), 3, 1), response(overCd, over(headersLimit), ok(exact, 2)), 2*time.Minute)
		wantHeaders(t, got, map[string]string{
			"RateLimit-Policy":  `"features.headers";q=2;w=60, "features.exact";q=3;w=10`,
			"RateLimit":         `"features.headers";r=2;t=0, "features.exact";r=2;t=10`,
			"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "0", "Retry-After": "60",
		})
		s.call(t, request("features", 1, "headers=c"), response(okCode, ok(headersLimit, 1)), 2*time.Minute)
	})
	t.Run("a read with nothing left", func(t *testing.T) {
		s.call(t, request("features", 2, "headers=e"), response(okCode, ok(headersLimit, 0)), 2*time.Minute)
		got := s.call(t, withHits(request("features", 1, "headers=e", "exact=e"), 0, 1), response(overCd, over(headersLimit), ok(exact, 2)), 2*time.Minute)
		// A read learns when the whole limit is back (t), not when one
		// request would fit: Retry-After is t.
		wantHeaders(t, got, map[string]string{
			"RateLimit-Policy":  `"features.headers";q=2;w=60, "features.exact";q=3;w=10`,
			"RateLimit":         `"features.headers";r=0;t=90, "features.exact";r=2;t=10`,
			"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "90", "Retry-After": "90",
		})
	})
}

// TestUnlimitedReplaces: an unlimited descriptor's replaces drops the
// limits it names, as envoyproxy/ratelimit does (constructLimitsToCheck in
// src/service/ratelimit.go collects every matched limit's replaces,
// unlimited ones included, before it sets the unlimited ones aside).
func TestUnlimitedReplaces(t *testing.T) {
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC)}
	s := startRLS(t, "testdata/integration", clk)
	tenant := &pb.RateLimitResponse_RateLimit{Name: "tenant_limit", RequestsPerUnit: 1, Unit: minute}
	unlimited := &pb.RateLimitResponse_DescriptorStatus{Code: okCode, LimitRemaining: math.MaxUint32}
	for range 3 {
		s.call(t, request("features", 1, "tenant=u", "internal=x"), response(okCode, unmatched, unlimited), 0)
	}
	// Alone, the tenant's limit applies, and was not counted above.
	s.call(t, request("features", 1, "tenant=u"), response(okCode, ok(tenant, 0)), 2*time.Minute)
	s.call(t, request("features", 1, "tenant=u"), response(overCd, over(tenant)), 2*time.Minute)
}
