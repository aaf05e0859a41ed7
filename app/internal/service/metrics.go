package service

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fleetlimit/fleetlimit/app/internal/topk"
	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// metrics holds the service's Prometheus metrics on a private registry (no
// global state: two servers in one test process do not collide). Every label
// value comes from configuration or a fixed set, never from client input.
type metrics struct {
	reg          *prometheus.Registry
	decisions    *prometheus.CounterVec   // policy, result, mode
	errors       *prometheus.CounterVec   // policy, kind
	redisLatency *prometheus.HistogramVec // outcome
	requests     *prometheus.CounterVec   // route, code
	transitions  *prometheus.CounterVec   // from, to
	uncounted    prometheus.Counter
	nearLimit    *prometheus.CounterVec
	recovery     *recoveryMetrics
	top          *topk.Tracker // the identities refused most, for GET /admin/top (top.go); never a label
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_decisions_total",
			Help: "Rate-limit decisions by policy, result (allowed, denied; shadow policies included) and mode (what decided).",
		}, []string{"policy", "result", "mode"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_errors_total",
			Help: "Limiter errors that reached the HTTP layer, by policy and kind (invalid_request, unavailable, bad_reply, invalid_policy, other).",
		}, []string{"policy", "kind"}),
		redisLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_redis_call_duration_seconds",
			Help:    "Latency of rate-limit calls to Redis, by outcome (ok, unavailable, bad_reply, other).",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"outcome"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_http_requests_total",
			Help: "Public HTTP requests by route pattern and status code.",
		}, []string{"route", "code"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_breaker_transitions_total",
			Help: "Circuit breaker transitions by from and to state (closed, open, recovering).",
		}, []string{"from", "to"}),
	}
	m.uncounted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_uncounted_requests_total",
		Help: "Requests whose handler ran without a counted decision: a policy failed open (its limiter failed, or its failure mode is open while Redis is out).",
	})
	m.nearLimit = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_near_limit_total",
		Help: "Admissions that left at most 20% of the policy's quota (remaining <= limit/5), by policy and mode; a subset of ratelimit_decisions_total{result=\"allowed\"}.",
	}, []string{"policy", "mode"})
	m.recovery = newRecoveryMetrics(time.Now)
	m.top = topk.New(topEntries, topWindow)
	m.reg.MustRegister(m.decisions, m.nearLimit, m.errors, m.redisLatency, m.requests, m.transitions, m.uncounted, m.recovery.duration,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// instrument wraps a limiter so that every decision and error is counted.
// A batch stays a batch (one round trip for a route's policies) when the
// limiter takes batches.
func (m *metrics) instrument(next ratelimit.Limiter) ratelimit.Limiter {
	return instrumented{m: m, next: next}
}

type instrumented struct {
	m    *metrics
	next ratelimit.Limiter
}

func (in instrumented) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	d, err := in.next.Decide(ctx, req)
	in.m.count(req, d, err)
	return d, err
}

func (in instrumented) DecideBatch(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, []error) {
	ds, errs := ratelimit.DecideAll(ctx, in.next, reqs)
	for i, r := range reqs {
		in.m.count(r, ds[i], errs[i])
	}
	return ds, errs
}

func (m *metrics) count(req ratelimit.Request, d ratelimit.Decision, err error) {
	if err != nil {
		m.errors.WithLabelValues(req.Policy.Name, errorKind(err)).Inc()
		return
	}
	result := "allowed"
	if !d.Allowed {
		result = "denied"
		if m.top != nil && !req.ReadOnly {
			m.top.Observe(time.Now(), req.Policy.Name, req.Key)
		}
	} else if nearLimit(d) {
		m.nearLimit.WithLabelValues(req.Policy.Name, string(d.Mode)).Inc()
	}
	m.decisions.WithLabelValues(req.Policy.Name, result, string(d.Mode)).Inc()
}

// nearLimit reports whether an admission left at most a fifth of the
// quota: envoyproxy/ratelimit's near_limit, at its default ratio (0.8).
func nearLimit(d ratelimit.Decision) bool {
	return d.Allowed && d.Limit > 0 && d.Remaining*5 <= d.Limit
}

// observeRedis records one Redis call (the redisstore hooks call it).
func (m *metrics) observeRedis(err error, latency time.Duration) {
	outcome := "ok"
	if err != nil {
		outcome = errorKind(err)
	}
	m.redisLatency.WithLabelValues(outcome).Observe(latency.Seconds())
}

// observeTransition counts breaker transitions.
func (m *metrics) observeTransition(from, to resilient.BreakerState) {
	m.transitions.WithLabelValues(string(from), string(to)).Inc()
	m.recovery.observe(from, to)
}

// watchStatus exports the limiter layer's status as gauges: live instances,
// journal size, breaker state.
func (m *metrics) watchStatus(status func() Status) {
	m.reg.MustRegister(&statusCollector{status: status})
}

// watchLocal exports the in-memory store's size and evictions.
func (m *metrics) watchLocal(stats func() (keys int, evictions uint64)) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_local_keys",
			Help: "Keys held in the in-memory store.",
		}, func() float64 { n, _ := stats(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimit_local_evictions_total",
			Help: "Keys evicted from the in-memory store to stay within RL_KEY_CAPACITY.",
		}, func() float64 { _, n := stats(); return float64(n) }),
	)
}

func errorKind(err error) string {
	switch {
	case errors.Is(err, ratelimit.ErrInvalidRequest):
		return "invalid_request"
	case errors.Is(err, ratelimit.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ratelimit.ErrBadReply):
		return "bad_reply"
	case errors.Is(err, ratelimit.ErrInvalidPolicy):
		return "invalid_policy"
	}
	return "other"
}

var (
	liveInstancesDesc = prometheus.NewDesc("ratelimit_live_instances",
		"Instances the limiter layer counts as live (the fleet size its fallback shares divide by).", nil, nil)
	journalDesc = prometheus.NewDesc("ratelimit_journal_entries",
		"Locally granted decisions journaled and not yet reconciled with Redis.", nil, nil)
	breakerDesc = prometheus.NewDesc("ratelimit_breaker_state",
		"1 for the circuit breaker's current state (closed, open, recovering); absent without a breaker.", []string{"state"}, nil)
)

// statusCollector turns the limiter layer's part of Status into gauges at
// scrape time.
type statusCollector struct {
	status func() Status
}

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- liveInstancesDesc
	ch <- journalDesc
	ch <- breakerDesc
	ch <- journalUnitsDesc
	ch <- duplicateBatchesDesc
	ch <- evictionsDesc
	ch <- suspectDesc
	ch <- cachedRefusalsDesc
	ch <- journalDamageDesc
	ch <- leaseDesc
	ch <- leaseUnitsDesc
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	ch <- prometheus.MustNewConstMetric(liveInstancesDesc, prometheus.GaugeValue, float64(st.LiveInstances))
	ch <- prometheus.MustNewConstMetric(journalDesc, prometheus.GaugeValue, float64(st.JournalSize))
	if st.Breaker != "" {
		ch <- prometheus.MustNewConstMetric(breakerDesc, prometheus.GaugeValue, 1, st.Breaker)
	}
	if r := st.Limiter; r != nil {
		j := r.Journal
		for _, c := range []struct {
			what string
			v    uint64
		}{
			{"granted", j.Granted}, {"reloaded", j.Reloaded}, {"replayed", j.Replayed}, {"present", j.Present},
			{"dropped", j.Dropped}, {"duplicate", j.DuplicateUnits}, {"overflow", j.Overflow},
		} {
			ch <- prometheus.MustNewConstMetric(journalUnitsDesc, prometheus.CounterValue, float64(c.v), c.what)
		}
		ch <- prometheus.MustNewConstMetric(duplicateBatchesDesc, prometheus.CounterValue, float64(j.Duplicates))
		ch <- prometheus.MustNewConstMetric(evictionsDesc, prometheus.CounterValue, float64(r.Evictions))
		ch <- prometheus.MustNewConstMetric(suspectDesc, prometheus.GaugeValue, float64(r.Suspect))
		ch <- prometheus.MustNewConstMetric(cachedRefusalsDesc, prometheus.CounterValue, float64(r.CachedRefusals))
		ch <- prometheus.MustNewConstMetric(journalDamageDesc, prometheus.CounterValue, float64(j.Corrupt), "corrupt_line")
		ch <- prometheus.MustNewConstMetric(journalDamageDesc, prometheus.CounterValue, float64(j.WriteErrors), "write_error")
	}
	if ls := st.Lease; ls != nil {
		for _, c := range []struct {
			what string
			v    uint64
		}{
			{"served", ls.Served}, {"draws", ls.Draws}, {"refused_draws", ls.Refused},
			{"refunded_units", ls.Refunded}, {"unrefunded_units", ls.Lost},
		} {
			ch <- prometheus.MustNewConstMetric(leaseDesc, prometheus.CounterValue, float64(c.v), c.what)
		}
		ch <- prometheus.MustNewConstMetric(leaseUnitsDesc, prometheus.GaugeValue, float64(ls.Units))
	}
}

var (
	leaseDesc = prometheus.NewDesc("ratelimit_lease_total",
		"Lease mode: requests served from a lease (served), leases taken (draws), draws Redis refused (refused_draws), unused units given back (refunded_units) and not given back (unrefunded_units).", []string{"what"}, nil)
	leaseUnitsDesc = prometheus.NewDesc("ratelimit_lease_units",
		"Units this instance holds on lease now (counted in Redis, not yet used).", nil, nil)
	journalUnitsDesc = prometheus.NewDesc("ratelimit_journal_units_total",
		"Units granted locally and what became of them: granted (journaled), reloaded (found at start), replayed, present (already in Redis), dropped (expired), duplicate (refused by a replay marker), overflow (journal full).", []string{"what"}, nil)
	duplicateBatchesDesc = prometheus.NewDesc("ratelimit_replay_duplicate_batches_total",
		"Replay batches Redis refused because their idempotency marker was set.", nil, nil)
	evictionsDesc = prometheus.NewDesc("ratelimit_fallback_evictions_total",
		"Keys evicted from the local fallback state to stay within RL_KEY_CAPACITY.", nil, nil)
	journalDamageDesc = prometheus.NewDesc("ratelimit_journal_problems_total",
		"Journal lines skipped at start as torn or corrupt (corrupt_line), and journal writes that failed (write_error: grants handed out without a durable record).", []string{"what"}, nil)
	cachedRefusalsDesc = prometheus.NewDesc("ratelimit_cached_refusals_total",
		"Requests refused without a Redis round trip: Redis had refused their key until a time not yet reached (token bucket, GCRA, sliding window log).", nil, nil)
	suspectDesc = prometheus.NewDesc("ratelimit_suspect_instances",
		"Instances whose heartbeat is missing but whose fallback lease may still run; their share is held back.", nil, nil)
)
