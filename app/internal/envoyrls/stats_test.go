package envoyrls_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/fleetlimit/fleetlimit/app/internal/envoyrls"
)

// statsConfig has a descriptor of each kind the stats name: a key alone
// (each value limited apart), a key with a value, both nested, a wildcard
// value, shadow mode, blocked and unlimited.
const statsConfig = `domain: shop
descriptors:
  - key: user_id
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: api
    value: search
    descriptors:
      - key: user_id
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: plan
    value: gold
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window_log}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: banned
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: health
    rate_limit: {unlimited: true}
  - key: file
    value: "img*"
    rate_limit: {unit: hour, requests_per_unit: 3}
`

// hitsRecorder sums the Hits WithStats reports, by domain and descriptor.
type hitsRecorder struct {
	mu  sync.Mutex
	got map[[2]string]envoyrls.Hits
}

func (r *hitsRecorder) record(h envoyrls.Hits) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := [2]string{h.Domain, h.Descriptor}
	s := r.got[k]
	s.Domain, s.Descriptor = h.Domain, h.Descriptor
	s.Total += h.Total
	s.WithinLimit += h.WithinLimit
	s.NearLimit += h.NearLimit
	s.OverLimit += h.OverLimit
	s.ShadowMode += h.ShadowMode
	r.got[k] = s
}

// TestStats: WithStats counts hits (hits_addend) per configured descriptor,
// as envoyproxy/ratelimit's per-descriptor stats do: many client values of
// one descriptor make one series named by the configuration's path, never
// by a client's value; near_limit is the admitted hits past floor(0.8 ×
// capacity), the part of a call's hits past it included; a refusal is over
// the limit whole; shadow mode counts over the limit and shadow_mode; an
// unlimited or unmatched descriptor, or an unknown domain, counts nothing.
func TestStats(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "shop.yaml"), []byte(statsConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	rec := &hitsRecorder{got: map[[2]string]envoyrls.Hits{}}
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC)}
	s := startRLS(t, dir, clk, envoyrls.WithStats(rec.record))
	send := func(req *rlv3.RateLimitDescriptor_RateLimitOverride, hits uint32, descriptors ...string) {
		t.Helper()
		r := request("shop", hits, descriptors...)
		if req != nil {
			r.Descriptors[0].Limit = req
		}
		if _, err := s.client.ShouldRateLimit(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}

	// A key alone: 30 client values, 12 calls each against 10 an hour.
	// The 9th and 10th hits are near the limit, the 11th and 12th over.
	for i := range 30 {
		for range 12 {
			send(nil, 1, fmt.Sprintf("user_id=u%d", i))
		}
	}
	// Nested under a key and value, 5 an hour (threshold 4): 3 hits, then 2
	// of which one passes 4, then 1 over.
	for i := range 4 {
		for _, h := range []uint32{3, 2, 1} {
			send(nil, h, fmt.Sprintf("api=search,user_id=u%d", i))
		}
	}
	// 10 an hour: 6, then 4 (2 past 8), then 11 (more than ever fit: over,
	// nothing counted), then a read with nothing left (over, no hit).
	for _, h := range []uint32{6, 4, 11} {
		send(nil, h, "plan=gold")
	}
	send(nil, 1, "plan=gold", "plan=silver") // one more over; silver matches nothing
	r := request("shop", 1, "plan=gold")
	withHits(r, 0)
	if _, err := s.client.ShouldRateLimit(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	// Shadow mode, 2 an hour (threshold 1): 3 values × 3 calls, all OK.
	for i := range 3 {
		for range 3 {
			got, err := s.client.ShouldRateLimit(t.Context(), request("shop", 1, fmt.Sprintf("trial=t%d", i)))
			if err != nil || got.OverallCode != okCode {
				t.Fatalf("shadow mode: %v, %v; want OK", got, err)
			}
		}
	}
	send(nil, 1, "banned=b1")
	send(nil, 2, "banned=b2")
	for i := range 3 {
		send(nil, 1, fmt.Sprintf("file=img-%d", i), "health=h")
	}
	// Overrides: of a configured descriptor, under its path; of none, as
	// "override".
	perHour := &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4, Unit: typev3.RateLimitUnit_HOUR}
	send(perHour, 1, "user_id=o1")
	for range 5 {
		send(perHour, 1, "anything=x")
	}
	if _, err := s.client.ShouldRateLimit(t.Context(), request("unknown", 1, "user_id=u1")); err != nil {
		t.Fatal(err)
	}

	want := map[[2]string]envoyrls.Hits{}
	for _, h := range []envoyrls.Hits{
		{Descriptor: "user_id", Total: 361, WithinLimit: 301, NearLimit: 60, OverLimit: 60},
		{Descriptor: "api_search.user_id", Total: 24, WithinLimit: 20, NearLimit: 4, OverLimit: 4},
		{Descriptor: "plan_gold", Total: 22, WithinLimit: 10, NearLimit: 2, OverLimit: 12},
		{Descriptor: "trial", Total: 9, WithinLimit: 6, NearLimit: 3, OverLimit: 3, ShadowMode: 3},
		{Descriptor: "banned", Total: 3, OverLimit: 3},
		{Descriptor: "file_img*", Total: 3, WithinLimit: 3},
		{Descriptor: "override", Total: 5, WithinLimit: 4, NearLimit: 1, OverLimit: 1},
	} {
		h.Domain = "shop"
		want[[2]string{h.Domain, h.Descriptor}] = h
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !maps.Equal(rec.got, want) {
		t.Errorf("stats:\n got %v\nwant %v", rec.got, want)
	}
}
