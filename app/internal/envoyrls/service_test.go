package envoyrls_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

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
