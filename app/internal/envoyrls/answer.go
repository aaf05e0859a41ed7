// The answer to ShouldRateLimit: the overall code, each descriptor's
// status and the response headers, from the decisions (and the hits
// reported to WithStats).

package envoyrls

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/httplimit"
)

// answer builds the response from the decisions, and counts them (WithStats).
func (s *Service) answer(ctx context.Context, domain string, checks []check, ds []ratelimit.Decision) *pb.RateLimitResponse {
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(checks))}
	// What the headers describe: every limited descriptor, in order, with
	// the decision its status reports.
	var limited []int
	decided := make([]ratelimit.Decision, len(checks))
	for i := range checks {
		c := &checks[i]
		st := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch {
		case c.limit == nil:
			continue
		case c.limit.Unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		st.CurrentLimit = c.rl
		// A blocked descriptor is refused for good: its whole window is
		// what it reports.
		d := ratelimit.Decision{ResetAfter: c.policy.Window, RetryAfter: c.policy.Window}
		over := c.over
		if c.at >= 0 {
			d = ds[c.at]
			over = over || !d.Allowed || c.readOnly && d.Remaining <= 0
			if !over {
				st.LimitRemaining = uint32(min(max(d.Remaining, 0), math.MaxUint32))
			}
		}
		st.DurationUntilReset = durationpb.New(d.ResetAfter)
		if over && (d.Allowed || d.RetryAfter <= 0) {
			// Refused with no refusal from the limiter (a read, too many
			// hits): Retry-After as for any refusal. Too many hits never
			// fit: look again in a window, as the algorithms say of a
			// cost above the limit. A read learns when the whole limit is
			// back, not when one unit is.
			d.Allowed, d.RetryAfter = false, c.policy.Window
			if !c.tooMany {
				d.RetryAfter = d.ResetAfter
			}
		}
		if over && !c.limit.Shadow {
			st.Code = pb.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
		}
		if s.stats != nil {
			s.stats(hits(domain, c, d, over))
		}
		decided[i], limited = d, append(limited, i)
	}
	if len(limited) == 0 || !s.headers && !s.debug {
		return resp
	}
	hdr, best := headers(checks, limited, decided)
	if s.headers {
		for _, k := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit",
			"X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
			if v := hdr.Get(k); v != "" {
				resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: k, Value: v})
			}
		}
	}
	if s.debug && best >= 0 {
		md := metadata.Pairs(MetadataServedBy, s.instance)
		if m := decided[best].Mode; m != "" { // none for a blocked descriptor: nothing decided it
			md.Append(MetadataMode, string(m))
		}
		_ = grpc.SetHeader(ctx, md)
	}
	return resp
}

// headers are the rate-limit headers of the limited descriptors
// checks[limited[j]], decided as decided[limited[j]], as the HTTP routes
// write them (httplimit.SetHeaders): every enforced descriptor's policy
// and state, the X-RateLimit trio of the most restrictive decision, and
// Retry-After when it refused; best is that descriptor's index in checks
// (-1: none). A shadow descriptor's refusal is reported as the dry run it
// is.
//
// SetHeaders takes valid policies only, and a blocked descriptor
// (requests_per_unit 0) has none: it goes in as a stand-in of quota 1 and
// a window of 1 s under a name no descriptor has ("rls-blocked-<index>":
// every descriptor's policy name holds a '.' or is "rls-" and hex
// digits), rewritten afterwards into its own name, q=0 and its window.
func headers(checks []check, limited []int, decided []ratelimit.Decision) (http.Header, int) {
	policies := make([]ratelimit.Policy, len(limited))
	ds := make([]ratelimit.Decision, len(limited))
	for j, i := range limited {
		c := &checks[i]
		policies[j], ds[j] = c.policy, decided[i]
		if c.limit.Block {
			policies[j] = ratelimit.Policy{Name: blockedName(i), Algorithm: DefaultAlgorithm, Limit: 1, Window: time.Second}
		}
		policies[j].Shadow = c.limit.Shadow
	}
	hdr := http.Header{}
	best := httplimit.SetHeaders(hdr, policies, ds)
	if best < 0 {
		return hdr, -1
	}
	best = limited[best]
	for _, i := range limited {
		c := &checks[i]
		if !c.limit.Block {
			continue
		}
		stand, own := strconv.Quote(blockedName(i)), strconv.Quote(c.policy.Name)
		window := strconv.FormatInt(int64((c.policy.Window+time.Second-1)/time.Second), 10)
		for _, k := range []string{"RateLimit-Policy", "RateLimit"} {
			if v := hdr.Get(k); v != "" {
				v = strings.Replace(v, stand+";q=1;w=1", own+";q=0;w="+window, 1)
				hdr.Set(k, strings.Replace(v, stand+";r=", own+";r=", 1))
			}
		}
		if i == best {
			hdr.Set("X-RateLimit-Limit", "0")
		}
	}
	return hdr, best
}

// hits counts descriptor c of a call in domain, decided d (over: refused,
// shadow mode or not).
func hits(domain string, c *check, d ratelimit.Decision, over bool) Hits {
	h := Hits{Domain: domain, Descriptor: c.limit.Descriptor, Total: c.hits}
	if over {
		h.OverLimit = c.hits
		if c.limit.Shadow {
			h.ShadowMode = c.hits
		}
		return h
	}
	h.WithinLimit = c.hits
	h.NearLimit = nearHits(d.Limit, d.Remaining, c.hits)
	return h
}

// nearHits is how many of the hits just admitted took the count (capacity
// minus remaining) past floor(0.8 × capacity), envoyproxy/ratelimit's
// near-limit threshold at its default ratio: with a capacity of 10, the 9th
// and the 10th hit.
func nearHits(capacity, remaining int64, hits uint64) uint64 {
	if capacity <= 0 {
		return 0
	}
	after := capacity - min(max(remaining, 0), capacity)
	threshold := capacity - (capacity+4)/5 // floor(4 × capacity / 5)
	if after <= threshold {
		return 0
	}
	return min(hits, uint64(after-threshold))
}

// blockedName is the stand-in policy name of the blocked descriptor at
// index i of a call (see headers).
func blockedName(i int) string { return "rls-blocked-" + strconv.Itoa(i) }
