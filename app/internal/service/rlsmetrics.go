package service

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/fleetlimit/app/internal/envoyrls"
)

// rlsHits are the rate limit service's per-descriptor counts, in hits
// (hits_addend), envoyproxy/ratelimit's ratelimit.service.rate_limit.
// <domain>.<descriptor>.* stats as Prometheus counters (docs/DOORS.md maps
// one to the other):
//
//   - ratelimit_rls_hits_total{domain, descriptor, result}: result is
//     within_limit or over_limit, so that their sum is total_hits;
//   - ratelimit_rls_near_limit_hits_total{domain, descriptor}: a part of
//     within_limit;
//   - ratelimit_rls_shadow_mode_hits_total{domain, descriptor}: a part of
//     over_limit.
//
// domain and descriptor come from the configuration (envoyrls.Hits), never
// from a client, so the series are bounded by it. A descriptor's series
// appear at its first hit; those of a descriptor a reload removed stay,
// unchanged, until the process restarts.
type rlsHits struct {
	hits, near, shadow *prometheus.CounterVec
}

func newRLSHits(reg prometheus.Registerer) *rlsHits {
	labels := []string{"domain", "descriptor"}
	m := &rlsHits{
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rls_hits_total",
			Help: "Hits (hits_addend) of the rate limit service's limited descriptors, by domain, configured descriptor path and result (within_limit, over_limit; shadow mode's included): envoyproxy/ratelimit's within_limit and over_limit, their sum its total_hits.",
		}, append(labels, "result")),
		near: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rls_near_limit_hits_total",
			Help: "Admitted hits of the rate limit service that took a descriptor's count past 80% of its capacity, by domain and configured descriptor path: envoyproxy/ratelimit's near_limit, a part of result=\"within_limit\".",
		}, labels),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rls_shadow_mode_hits_total",
			Help: "Hits of the rate limit service's shadow_mode descriptors over their limit, answered OK, by domain and configured descriptor path: envoyproxy/ratelimit's shadow_mode, a part of result=\"over_limit\".",
		}, labels),
	}
	reg.MustRegister(m.hits, m.near, m.shadow)
	return m
}

// record counts one descriptor of a call (envoyrls.WithStats). All four
// series of a descriptor are made at its first hit, at 0 where nothing
// counts, so that rate() and increase() see the first refusal.
func (m *rlsHits) record(h envoyrls.Hits) {
	m.hits.WithLabelValues(h.Domain, h.Descriptor, "within_limit").Add(float64(h.WithinLimit))
	m.hits.WithLabelValues(h.Domain, h.Descriptor, "over_limit").Add(float64(h.OverLimit))
	m.near.WithLabelValues(h.Domain, h.Descriptor).Add(float64(h.NearLimit))
	m.shadow.WithLabelValues(h.Domain, h.Descriptor).Add(float64(h.ShadowMode))
}
