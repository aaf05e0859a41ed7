package service

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// recoveryMetrics measure what the alerts of prometheus/rules.yml watch
// beyond the breaker and the journal: how long recoveries take and what
// they found lost.
type recoveryMetrics struct {
	duration        prometheus.Histogram
	recoveringSince atomic.Int64 // unix ns the breaker last entered recovering; 0: not recovering
	now             func() time.Time
}

func newRecoveryMetrics(now func() time.Time) *recoveryMetrics {
	return &recoveryMetrics{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimit_recovery_duration_seconds",
			Help:    "Time the breaker spent recovering (replaying the journal, waiting for the missing instances) before it closed.",
			Buckets: []float64{.1, .25, .5, 1, 2, 5, 10, 30, 60, 120, 300},
		}),
		now: now,
	}
}

// observe follows a breaker transition (called with the breaker's lock
// held: no I/O).
func (r *recoveryMetrics) observe(from, to resilient.BreakerState) {
	switch {
	case to == resilient.BreakerRecovering:
		r.recoveringSince.Store(r.now().UnixNano())
	case from == resilient.BreakerRecovering:
		since := r.recoveringSince.Swap(0)
		if to == resilient.BreakerClosed && since != 0 {
			r.duration.Observe(time.Duration(r.now().UnixNano() - since).Seconds())
		}
	}
}

var (
	restoresDesc = prometheus.NewDesc("ratelimit_restores_total",
		"Times Redis came back without its data and this instance put back the usage its snapshots knew.", nil, nil)
	raisesDesc = prometheus.NewDesc("ratelimit_raises_total",
		"Times this instance raised its keys to the usage its replies had shown: after Redis lost recent writes, and after each restore.", nil, nil)
	lostWritesDesc = prometheus.NewDesc("ratelimit_lost_writes_total",
		"Times this instance found that Redis had lost writes it acknowledged (its write counter went back: a replica promoted while behind, an AOF that lost its tail).", nil, nil)
)

// recoveryCollector exports the resilient limiter's restores and raises,
// and the store's lost-writes count, at scrape time; nothing without a
// resilient limiter.
type recoveryCollector struct {
	status func() Status
}

func (c *recoveryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- restoresDesc
	ch <- raisesDesc
	ch <- lostWritesDesc
}

func (c *recoveryCollector) Collect(ch chan<- prometheus.Metric) {
	if r := c.status().Limiter; r != nil {
		ch <- prometheus.MustNewConstMetric(restoresDesc, prometheus.CounterValue, float64(r.Restores))
		ch <- prometheus.MustNewConstMetric(raisesDesc, prometheus.CounterValue, float64(r.Raises))
		ch <- prometheus.MustNewConstMetric(lostWritesDesc, prometheus.CounterValue, float64(r.LostWrites))
	}
}
