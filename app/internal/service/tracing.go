package service

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
)

// tracing is the service's OpenTelemetry tracing (docs/OPERATIONS.md,
// "Tracing"), configured by the standard OTEL_* variables and off unless
// they name an exporter. A nil *tracing is off: its methods then install
// nothing (no HTTP wrapper, no gRPC stats handler, no Redis hook, no
// decision wrapper), so that tracing off costs the decision path nothing.
// Nothing here touches OpenTelemetry's globals: several servers in one
// process each have their own provider.
type tracing struct {
	tp     *sdktrace.TracerProvider
	prop   propagation.TextMapPropagator
	tracer trace.Tracer // the service's own spans: decisions and recoveries
}

// tracerName is the instrumentation scope of the service's own spans.
const tracerName = "github.com/fleetlimit/fleetlimit/app/internal/service"

// tracingSettings is what the OTEL_* variables ask for.
type tracingSettings struct {
	protocol    string // "grpc" or "http/protobuf"
	endpoint    string // the URL traces are sent to
	headers     map[string]string
	timeout     time.Duration // 0: the exporter's default (10 s)
	gzip        bool
	sampler     sdktrace.Sampler
	samplerName string
	resource    []attribute.KeyValue
	batch       []sdktrace.BatchSpanProcessorOption
}

// newTracing reads the OTEL_* variables through getenv and, when they turn
// tracing on, builds the exporter and the tracer provider; nil when off. A
// bad value is a *ConfigError naming its variable. The exporter connects
// lazily: an unreachable collector does not stop the start (its spans are
// dropped, and the SDK says so on its own logger).
func newTracing(getenv func(string) string, instance string, log *slog.Logger) (*tracing, error) {
	st, err := loadTracingSettings(getenv, instance)
	if err != nil || st == nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	if st.protocol == "grpc" {
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(st.endpoint)}
		if len(st.headers) > 0 {
			opts = append(opts, otlptracegrpc.WithHeaders(st.headers))
		}
		if st.timeout > 0 {
			opts = append(opts, otlptracegrpc.WithTimeout(st.timeout))
		}
		if st.gzip {
			opts = append(opts, otlptracegrpc.WithCompressor("gzip"))
		}
		exp, err = otlptracegrpc.New(context.Background(), opts...)
	} else {
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(st.endpoint)}
		if len(st.headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(st.headers))
		}
		if st.timeout > 0 {
			opts = append(opts, otlptracehttp.WithTimeout(st.timeout))
		}
		if st.gzip {
			opts = append(opts, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
		}
		exp, err = otlptracehttp.New(context.Background(), opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing exporter: %w", err)
	}
	res, err := resource.New(context.Background(), resource.WithTelemetrySDK(), resource.WithAttributes(st.resource...))
	if err != nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, st.batch...),
		sdktrace.WithSampler(st.sampler),
		sdktrace.WithResource(res),
	)
	log.Info("tracing on", slog.String("endpoint", st.endpoint), slog.String("protocol", st.protocol),
		slog.String("sampler", st.samplerName))
	return &tracing{
		tp:     tp,
		prop:   propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		tracer: tp.Tracer(tracerName),
	}, nil
}

// loadTracingSettings reads the OTEL_* variables; nil when tracing is off:
// OTEL_SDK_DISABLED=true, OTEL_TRACES_EXPORTER=none, or neither an OTLP
// endpoint nor OTEL_TRACES_EXPORTER=otlp. The SDK would read most of them
// from the process environment itself, ignoring getenv and swallowing bad
// values; read here, each becomes an explicit option, and a bad one a
// *ConfigError. The exporter still reads its TLS files
// (OTEL_EXPORTER_OTLP_CERTIFICATE and the like) from the process
// environment.
func loadTracingSettings(getenv func(string) string, instance string) (*tracingSettings, error) {
	switch v := strings.ToLower(strings.TrimSpace(getenv("OTEL_SDK_DISABLED"))); v {
	case "true":
		return nil, nil
	case "", "false":
	default:
		return nil, configErr("OTEL_SDK_DISABLED", "want true or false, got %q", v)
	}
	exporter := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	tracesEndpoint, endpoint := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	switch exporter {
	case "none":
		return nil, nil
	case "":
		if tracesEndpoint == "" && endpoint == "" {
			return nil, nil
		}
	case "otlp":
	default:
		return nil, configErr("OTEL_TRACES_EXPORTER", "want otlp or none, got %q", exporter)
	}

	st := &tracingSettings{protocol: "http/protobuf"}
	if name, v := firstSet(getenv, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); v != "" {
		if v != "grpc" && v != "http/protobuf" {
			return nil, configErr(name, "want grpc or http/protobuf, got %q", v)
		}
		st.protocol = v
	}
	var err error
	if st.endpoint, err = otlpEndpoint(st.protocol, tracesEndpoint, endpoint); err != nil {
		return nil, err
	}
	if name, v := firstSet(getenv, "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"); v != "" {
		if st.headers, err = keyValues(name, v); err != nil {
			return nil, err
		}
	}
	if name, v := firstSet(getenv, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"); v != "" {
		ms, err := positiveInt(name, v)
		if err != nil {
			return nil, err
		}
		st.timeout = time.Duration(ms) * time.Millisecond
	}
	if name, v := firstSet(getenv, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"); v != "" {
		if v != "gzip" && v != "none" {
			return nil, configErr(name, "want gzip or none, got %q", v)
		}
		st.gzip = v == "gzip"
	}
	if st.sampler, st.samplerName, err = tracesSampler(getenv("OTEL_TRACES_SAMPLER"), getenv("OTEL_TRACES_SAMPLER_ARG")); err != nil {
		return nil, err
	}
	if st.resource, err = tracingResource(getenv, instance); err != nil {
		return nil, err
	}
	for _, b := range []struct {
		name string
		opt  func(int) sdktrace.BatchSpanProcessorOption
	}{
		{"OTEL_BSP_SCHEDULE_DELAY", func(ms int) sdktrace.BatchSpanProcessorOption {
			return sdktrace.WithBatchTimeout(time.Duration(ms) * time.Millisecond)
		}},
		{"OTEL_BSP_EXPORT_TIMEOUT", func(ms int) sdktrace.BatchSpanProcessorOption {
			return sdktrace.WithExportTimeout(time.Duration(ms) * time.Millisecond)
		}},
		{"OTEL_BSP_MAX_QUEUE_SIZE", sdktrace.WithMaxQueueSize},
		{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", sdktrace.WithMaxExportBatchSize},
	} {
		if v := getenv(b.name); v != "" {
			n, err := positiveInt(b.name, v)
			if err != nil {
				return nil, err
			}
			st.batch = append(st.batch, b.opt(n))
		}
	}
	return st, nil
}

// firstSet returns the first of names that getenv has a value for, and
// the value, trimmed; "" when none.
func firstSet(getenv func(string) string, names ...string) (name, value string) {
	for _, n := range names {
		if v := strings.TrimSpace(getenv(n)); v != "" {
			return n, v
		}
	}
	return "", ""
}

// otlpEndpoint is the URL traces go to: the traces endpoint as it is; else
// the general endpoint, with /v1/traces appended over HTTP; else the
// specification's default for the protocol.
func otlpEndpoint(protocol, traces, general string) (string, error) {
	name, v := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", strings.TrimSpace(traces)
	if v == "" {
		name, v = "OTEL_EXPORTER_OTLP_ENDPOINT", strings.TrimSpace(general)
	}
	if v == "" {
		if protocol == "grpc" {
			return "http://localhost:4317", nil
		}
		return "http://localhost:4318/v1/traces", nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", configErr(name, "want an http:// or https:// URL, got %q", v)
	}
	if name == "OTEL_EXPORTER_OTLP_ENDPOINT" && protocol == "http/protobuf" {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	}
	return u.String(), nil
}

// keyValues parses the specification's "k1=v1,k2=v2" list (headers,
// resource attributes), values percent-decoded.
func keyValues(name, v string) (map[string]string, error) {
	out := map[string]string{}
	for item := range strings.SplitSeq(v, ",") {
		if strings.TrimSpace(item) == "" {
			continue
		}
		k, val, ok := strings.Cut(item, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, configErr(name, "%q is not key=value", item)
		}
		dec, err := url.PathUnescape(strings.TrimSpace(val))
		if err != nil {
			return nil, configErr(name, "%q: %w", item, err)
		}
		out[k] = dec
	}
	return out, nil
}

func positiveInt(name, v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0, configErr(name, "want a positive integer, got %q", v)
	}
	return n, nil
}

// tracesSampler is OTEL_TRACES_SAMPLER with its argument (the
// specification's names; default parentbased_always_on).
func tracesSampler(name, arg string) (sdktrace.Sampler, string, error) {
	name, arg = strings.ToLower(strings.TrimSpace(name)), strings.TrimSpace(arg)
	ratio := 1.0
	if arg != "" && (name == "traceidratio" || name == "parentbased_traceidratio") {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, "", configErr("OTEL_TRACES_SAMPLER_ARG", "want a ratio between 0 and 1, got %q", arg)
		}
		ratio = r
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), "parentbased_always_on", nil
	case "always_on":
		return sdktrace.AlwaysSample(), name, nil
	case "always_off":
		return sdktrace.NeverSample(), name, nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), name, nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), name, nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), name, nil
	}
	return nil, "", configErr("OTEL_TRACES_SAMPLER", "want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio, got %q", name)
}

// tracingResource is service.name "fleetlimit" and service.instance.id
// RL_INSTANCE, then OTEL_RESOURCE_ATTRIBUTES over them, then
// OTEL_SERVICE_NAME over service.name.
func tracingResource(getenv func(string) string, instance string) ([]attribute.KeyValue, error) {
	attrs := map[string]string{"service.name": "fleetlimit", "service.instance.id": instance}
	if v := getenv("OTEL_RESOURCE_ATTRIBUTES"); v != "" {
		kv, err := keyValues("OTEL_RESOURCE_ATTRIBUTES", v)
		if err != nil {
			return nil, err
		}
		for k, v := range kv {
			attrs[k] = v
		}
	}
	if v := strings.TrimSpace(getenv("OTEL_SERVICE_NAME")); v != "" {
		attrs["service.name"] = v
	}
	out := make([]attribute.KeyValue, 0, len(attrs))
	for k, v := range attrs {
		out = append(out, attribute.String(k, v))
	}
	return out, nil
}

// handler wraps the public server's handler in a server span per request,
// continuing the caller's W3C traceparent (nginx passes it through).
// logRequests names the span after the route once chi has matched it.
func (t *tracing) handler(h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return otelhttp.NewHandler(h, "fleetlimit",
		otelhttp.WithTracerProvider(t.tp), otelhttp.WithPropagators(t.prop),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider())) // metrics are Prometheus's
}

// nameSpan names a request's server span "GET /api/gcra" after its route
// pattern (not its path: one name per route).
func (t *tracing) nameSpan(r *http.Request, route string) {
	if t == nil {
		return
	}
	span := trace.SpanFromContext(r.Context())
	span.SetName(r.Method + " " + route)
	span.SetAttributes(attribute.String("http.route", route))
}

// rlsMethod is the one gRPC method traced: health checks and reflection
// are not.
const rlsMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// grpcServerOptions is the gRPC door's stats handler: a server span per
// ShouldRateLimit call, continuing the traceparent in its metadata.
func (t *tracing) grpcServerOptions() []grpc.ServerOption {
	if t == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.tp), otelgrpc.WithPropagators(t.prop),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelgrpc.WithFilter(filters.FullMethodName(rlsMethod))))}
}

// instrumentRedis adds go-redis' tracing hook to client: a span per
// command or pipeline, named after it (EVALSHA, FCALL, "redis.pipeline
// ..."). Without the statement (keys carry identities: API key ids, client
// addresses) or the caller's file and line (a stack walk per call). With
// childOnly, a call starts a span only under one its context already
// carries: the heartbeats (ten a second), probes and refunds each made a
// trace of their own.
func (t *tracing) instrumentRedis(client redis.UniversalClient, childOnly bool) error {
	if t == nil {
		return nil
	}
	var tp trace.TracerProvider = t.tp
	if childOnly {
		tp = childSpans{tp: tp}
	}
	return redisotel.InstrumentTracing(client, redisotel.WithTracerProvider(tp),
		redisotel.WithDBStatement(false), redisotel.WithCallerEnabled(false))
}

// limiter wraps next in a span per decision (tracedLimiter).
func (t *tracing) limiter(next ratelimit.Limiter) ratelimit.Limiter {
	if t == nil {
		return next
	}
	return tracedLimiter{tracer: t.tracer, next: next}
}

// shutdown ends the provider, exporting the spans still queued within
// ctx's deadline.
func (t *tracing) shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}
