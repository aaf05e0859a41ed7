package service

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/resilient"
)

// tracedLimiter starts a "ratelimit.decide" span around every decision,
// under the request's span; the store's Redis calls are its children. A
// batch (a route's policies in one round trip) is one span, whose
// attributes describe the decision that bound the request (see binding),
// with every policy in ratelimit.policies. Installed only when tracing is
// on (tracing.limiter).
type tracedLimiter struct {
	tracer trace.Tracer
	next   ratelimit.Limiter
}

// The decision span's attribute keys.
const (
	attrPolicy    = attribute.Key("ratelimit.policy")
	attrPolicies  = attribute.Key("ratelimit.policies")
	attrMode      = attribute.Key("ratelimit.mode")
	attrAllowed   = attribute.Key("ratelimit.allowed")
	attrRemaining = attribute.Key("ratelimit.remaining")
	attrLimit     = attribute.Key("ratelimit.limit")
)

func (l tracedLimiter) Decide(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	ctx, span := l.tracer.Start(ctx, "ratelimit.decide")
	d, err := l.next.Decide(ctx, req)
	if span.IsRecording() {
		endDecision(span, []ratelimit.Request{req}, []ratelimit.Decision{d}, []error{err})
	}
	span.End()
	return d, err
}

func (l tracedLimiter) DecideBatch(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Decision, []error) {
	ctx, span := l.tracer.Start(ctx, "ratelimit.decide")
	ds, errs := ratelimit.DecideAll(ctx, l.next, reqs)
	if span.IsRecording() {
		endDecision(span, reqs, ds, errs)
	}
	span.End()
	return ds, errs
}

// endDecision sets a decision span's attributes, and its status to error
// when a decision failed.
func endDecision(span trace.Span, reqs []ratelimit.Request, ds []ratelimit.Decision, errs []error) {
	if len(reqs) > 1 {
		names := make([]string, len(reqs))
		for i, r := range reqs {
			names[i] = r.Policy.Name
		}
		span.SetAttributes(attrPolicies.StringSlice(names))
	}
	for i, err := range errs {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, reqs[i].Policy.Name+": "+errorKind(err))
			break
		}
	}
	i := binding(reqs, ds, errs)
	if i < 0 {
		span.SetAttributes(attrPolicy.String(reqs[0].Policy.Name))
		return
	}
	d := ds[i]
	span.SetAttributes(attrPolicy.String(reqs[i].Policy.Name), attrMode.String(string(d.Mode)),
		attrAllowed.Bool(d.Allowed), attrRemaining.Int64(d.Remaining), attrLimit.Int64(d.Limit))
}

// binding is the decision a span reports: the first refusal, else the one
// with the fewest units left, among the enforced policies (the shadow ones
// only when every policy is a shadow); -1 when every decision failed.
func binding(reqs []ratelimit.Request, ds []ratelimit.Decision, errs []error) int {
	best := -1
	for i := range reqs {
		if errs[i] != nil {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b, d := ds[best], ds[i]
		switch bs, s := reqs[best].Policy.Shadow, reqs[i].Policy.Shadow; {
		case bs != s:
			if bs {
				best = i
			}
		case b.Allowed && (!d.Allowed || d.Remaining < b.Remaining):
			best = i
		}
	}
	return best
}

// recoverySpans turns the resilient limiter's recoveries into spans: one
// "ratelimit.recovery" trace from the breaker's move to recovering to its
// move to closed (or back to open: status error), with the journal units
// the recovery replayed. The library calls no tracing of its own and gives
// its replay no context a span could ride on; this follows its
// OnTransition hook instead. The counts are read from its Status off the
// breaker's lock, where OnTransition runs: the counters before a recovery
// when the breaker opens (a replay runs only while recovering), the
// counters after it once it ends.
type recoverySpans struct {
	tracer  trace.Tracer
	limiter atomic.Pointer[resilient.Limiter] // set once resilient.New returned

	mu     sync.Mutex
	span   trace.Span // the recovery in progress; nil: none
	before recoveryCounts
}

// recoveryCounts are the Status counters a recovery moves.
type recoveryCounts struct {
	ok                                      bool // read
	replayed, present, dropped, dupl, rests uint64
}

func (r *recoverySpans) counts() recoveryCounts {
	l := r.limiter.Load()
	if l == nil {
		return recoveryCounts{}
	}
	st := l.Status()
	j := st.Journal
	return recoveryCounts{ok: true, replayed: j.Replayed, present: j.Present, dropped: j.Dropped, dupl: j.DuplicateUnits, rests: st.Restores}
}

// observe follows a breaker transition (resilient.Config.OnTransition:
// called with the breaker's lock held, so it reads nothing of the limiter
// itself).
func (r *recoverySpans) observe(from, to resilient.BreakerState) {
	now := time.Now()
	if from == resilient.BreakerRecovering {
		r.end(to, now)
	}
	switch to {
	case resilient.BreakerOpen:
		go func() {
			c := r.counts()
			r.mu.Lock()
			r.before = c
			r.mu.Unlock()
		}()
	case resilient.BreakerRecovering:
		_, span := r.tracer.Start(context.Background(), "ratelimit.recovery", trace.WithNewRoot(), trace.WithTimestamp(now),
			trace.WithAttributes(attribute.String("ratelimit.breaker.from", string(from))))
		r.mu.Lock()
		r.span = span
		r.mu.Unlock()
	}
}

// end ends the recovery in progress, at now, the breaker having moved to
// to.
func (r *recoverySpans) end(to resilient.BreakerState, now time.Time) {
	r.mu.Lock()
	span, before := r.span, r.before
	r.span = nil
	r.mu.Unlock()
	if span == nil {
		return
	}
	go func() {
		after := r.counts()
		span.SetAttributes(attribute.String("ratelimit.breaker.to", string(to)))
		if before.ok && after.ok {
			span.SetAttributes(
				attribute.Int64("ratelimit.replayed_units", int64(after.replayed-before.replayed)),
				attribute.Int64("ratelimit.present_units", int64(after.present-before.present)),
				attribute.Int64("ratelimit.dropped_units", int64(after.dropped-before.dropped)),
				attribute.Int64("ratelimit.duplicate_units", int64(after.dupl-before.dupl)),
				attribute.Int64("ratelimit.restores", int64(after.rests-before.rests)))
		}
		if to != resilient.BreakerClosed {
			span.SetStatus(codes.Error, "the breaker opened again")
		}
		span.End(trace.WithTimestamp(now))
	}()
}

// childSpans is a TracerProvider whose spans start only under a span their
// context already carries; elsewhere Start returns a span that records
// nothing.
type childSpans struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

func (c childSpans) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childTracer{tracer: c.tp.Tracer(name, opts...)}
}

type childTracer struct {
	embedded.Tracer
	tracer trace.Tracer
}

func (c childTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx) // no span in ctx: a no-op one
	}
	return c.tracer.Start(ctx, name, opts...)
}
