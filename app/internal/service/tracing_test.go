package service

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlimit/fleetlimit/app/ratelimit"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/memstore"
	"github.com/fleetlimit/fleetlimit/app/ratelimit/redistest"
)

// otlpReceiver is an OTLP/HTTP collector in the test process: it keeps the
// spans of every POST /v1/traces.
type otlpReceiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	posts    int
	spans    []*tracepb.Span
	resource map[string]string // the last export's resource attributes
}

func startReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	rc := &otlpReceiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil && (r.Method != http.MethodPost || r.URL.Path != "/v1/traces") {
			err = errors.New(r.Method + " " + r.URL.Path)
		}
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil {
			t.Errorf("receiver: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		rc.posts++
		for _, rs := range req.ResourceSpans {
			rc.resource = attrs(rs.GetResource().GetAttributes())
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// trace returns the spans received with trace id id.
func (rc *otlpReceiver) trace(id trace.TraceID) []*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range rc.spans {
		if trace.TraceID(s.TraceId) == id {
			out = append(out, s)
		}
	}
	return out
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		v := kv.GetValue()
		switch v.Value.(type) {
		case *commonpb.AnyValue_BoolValue:
			out[kv.Key] = map[bool]string{true: "true", false: "false"}[v.GetBoolValue()]
		case *commonpb.AnyValue_IntValue:
			out[kv.Key] = strconv.FormatInt(v.GetIntValue(), 10)
		default:
			out[kv.Key] = v.GetStringValue()
		}
	}
	return out
}

// startTraced starts the service as startServer does, with traces sent to
// rc (nil: env alone), and returns a stop that shuts it down, flushing
// its spans.
func startTraced(t *testing.T, rc *otlpReceiver, env map[string]string) (*Server, func()) {
	t.Helper()
	all := map[string]string{
		"RL_INSTANCE":       "test-1",
		"RL_LISTEN_ADDR":    "127.0.0.1:0",
		"RL_ADMIN_ADDR":     "127.0.0.1:0",
		"RL_JOURNAL_DIR":    t.TempDir(),
		"RL_API_KEY_SECRET": testSecret,
	}
	if rc != nil {
		all["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = rc.srv.URL + "/v1/traces"
	}
	for k, v := range env {
		all[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Start(ctx, envOf(all), io.Discard, io.Discard)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stop := sync.OnceFunc(func() {
		cancel()
		if err := s.Wait(); err != nil {
			t.Errorf("Wait: %v", err)
		}
	})
	t.Cleanup(stop)
	return s, stop
}

// caller is the span of a client that sends its traceparent.
var caller = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
	SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
	TraceFlags: trace.FlagsSampled,
})

func callerSpan() []byte { id := caller.SpanID(); return id[:] }

func traceparent() string {
	return "00-" + caller.TraceID().String() + "-" + caller.SpanID().String() + "-01"
}

// spanTree indexes a trace's spans by id and by parent.
type spanTree struct {
	byID     map[string]*tracepb.Span
	children map[string][]*tracepb.Span
}

func treeOf(spans []*tracepb.Span) spanTree {
	tr := spanTree{byID: map[string]*tracepb.Span{}, children: map[string][]*tracepb.Span{}}
	for _, s := range spans {
		tr.byID[hex.EncodeToString(s.SpanId)] = s
		p := hex.EncodeToString(s.ParentSpanId)
		tr.children[p] = append(tr.children[p], s)
	}
	return tr
}

// child returns the one child of parent named name.
func (tr spanTree) child(t *testing.T, parent []byte, name string) *tracepb.Span {
	t.Helper()
	var found []*tracepb.Span
	for _, s := range tr.children[hex.EncodeToString(parent)] {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans %q under %x, want 1; the trace: %v", len(found), name, parent, names(tr))
	}
	return found[0]
}

// redisSpans are the client spans of go-redis' hook (db.system redis)
// under parent.
func (tr spanTree) redisSpans(parent []byte) []*tracepb.Span {
	var out []*tracepb.Span
	for _, s := range tr.children[hex.EncodeToString(parent)] {
		if s.Kind == tracepb.Span_SPAN_KIND_CLIENT && attrs(s.Attributes)["db.system"] == "redis" {
			out = append(out, s)
		}
	}
	return out
}

func names(tr spanTree) []string {
	var out []string
	for _, s := range tr.byID {
		out = append(out, s.Name+" "+hex.EncodeToString(s.SpanId)+" (parent "+hex.EncodeToString(s.ParentSpanId)+")")
	}
	slices.Sort(out)
	return out
}

// TestTracingRedisDecision: a request decided in Redis is a server span
// continuing the caller's traceparent, named after its route; under it the
// decision (its policies, mode redis, admitted), and under that the Redis
// call that decided. The resource names the service and the instance.
func TestTracingRedisDecision(t *testing.T) {
	rc := startReceiver(t)
	redis := redistest.StartServer(t, redistest.ServerOptions{})
	s, stop := startTraced(t, rc, map[string]string{
		"RL_REDIS_URL":             "redis://" + redis.Addr() + "/0",
		"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test%20one",
	})
	if resp, body := get(t, "http://"+s.PublicAddr()+"/api/token-bucket", "X-API-Key", "traced", "traceparent", traceparent()); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	stop() // flushes

	tr := treeOf(rc.trace(caller.TraceID()))
	server := tr.child(t, callerSpan(), "GET /api/token-bucket")
	if server.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("server span kind %v", server.Kind)
	}
	if got := attrs(server.Attributes)["http.route"]; got != "/api/token-bucket" {
		t.Errorf("http.route = %q", got)
	}
	decide := tr.child(t, server.SpanId, "ratelimit.decide")
	a := attrs(decide.Attributes)
	if a["ratelimit.policy"] != "token-bucket" || a["ratelimit.mode"] != "redis" || a["ratelimit.allowed"] != "true" ||
		a["ratelimit.remaining"] != "99" || a["ratelimit.limit"] != "100" {
		t.Errorf("decision span attributes %v", a)
	}
	rs := tr.redisSpans(decide.SpanId)
	if len(rs) == 0 {
		t.Fatalf("no Redis span under the decision; the trace: %v", names(tr))
	}
	for _, r := range rs {
		if r.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("Redis span %q failed: %s", r.Name, r.Status.GetMessage())
		}
		if _, ok := attrs(r.Attributes)["db.statement"]; ok {
			t.Errorf("Redis span %q carries the statement (keys name identities)", r.Name)
		}
	}
	rc.mu.Lock()
	res := rc.resource
	rc.mu.Unlock()
	if res["service.name"] != "fleetlimit" || res["service.instance.id"] != "test-1" || res["deployment.environment"] != "test one" {
		t.Errorf("resource %v", res)
	}
	// The heartbeats and probes run without a request: they make no
	// trace of their own.
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, sp := range rc.spans {
		if len(sp.ParentSpanId) == 0 && sp.Kind == tracepb.Span_SPAN_KIND_CLIENT {
			t.Errorf("a Redis call outside any request made a trace: %q", sp.Name)
		}
	}
}

// TestTracingLocalDecision: with Redis out, the decision span says mode
// local, and no Redis call under it succeeded.
func TestTracingLocalDecision(t *testing.T) {
	rc := startReceiver(t)
	s, stop := startTraced(t, rc, map[string]string{"RL_REDIS_URL": "redis://" + deadAddr(t) + "/0"})
	if resp, body := get(t, "http://"+s.PublicAddr()+"/api/gcra", "X-API-Key", "traced", "traceparent", traceparent()); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	stop()

	tr := treeOf(rc.trace(caller.TraceID()))
	server := tr.child(t, callerSpan(), "GET /api/gcra")
	decide := tr.child(t, server.SpanId, "ratelimit.decide")
	if a := attrs(decide.Attributes); a["ratelimit.policy"] != "gcra" || a["ratelimit.mode"] != "local" || a["ratelimit.allowed"] != "true" {
		t.Errorf("decision span attributes %v", a)
	}
	for _, r := range tr.redisSpans(decide.SpanId) {
		if r.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("Redis span %q under a local decision did not fail", r.Name)
		}
	}
}

// TestTracingRecovery: Redis out and back makes one "ratelimit.recovery"
// trace, from the breaker's move to recovering to its close, with the
// journal units the recovery replayed.
func TestTracingRecovery(t *testing.T) {
	rc := startReceiver(t)
	redis := redistest.StartServer(t, redistest.ServerOptions{})
	s, stop := startTraced(t, rc, map[string]string{"RL_REDIS_URL": "redis://" + redis.Addr() + "/0", "RL_PROBE_INTERVAL": "50ms"})
	redis.Kill()
	for range 3 {
		if resp, body := get(t, "http://"+s.PublicAddr()+"/api/gcra", "X-API-Key", "outage"); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	waitBreaker(t, s, "open")
	redis.Restart(t)
	waitBreaker(t, s, "closed")
	stop()

	rc.mu.Lock()
	defer rc.mu.Unlock()
	var recoveries []map[string]string
	for _, sp := range rc.spans {
		if sp.Name == "ratelimit.recovery" {
			if len(sp.ParentSpanId) != 0 {
				t.Errorf("recovery span has a parent")
			}
			recoveries = append(recoveries, attrs(sp.Attributes))
		}
	}
	if len(recoveries) != 1 {
		t.Fatalf("%d recovery spans, want 1: %v", len(recoveries), recoveries)
	}
	a := recoveries[0]
	replayed, _ := strconv.Atoi(a["ratelimit.replayed_units"])
	present, _ := strconv.Atoi(a["ratelimit.present_units"])
	if a["ratelimit.breaker.from"] != "open" || a["ratelimit.breaker.to"] != "closed" || replayed+present < 3 {
		t.Errorf("recovery span attributes %v, want open to closed with the 3 local grants replayed", a)
	}
}

// waitBreaker waits until s's breaker is in state.
func waitBreaker(t *testing.T, s *Server, state string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.backend.status().Breaker != state {
		if time.Now().After(deadline) {
			t.Fatalf("breaker %s, want %s", s.backend.status().Breaker, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTracingRateLimitService: a ShouldRateLimit call over gRPC is a server
// span continuing the traceparent in its metadata, with the decision
// under it; the health check makes none.
func TestTracingRateLimitService(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n"+
		"    rate_limit: {unit: minute, requests_per_unit: 10}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rc := startReceiver(t)
	s, stop := startTraced(t, rc, map[string]string{"RL_GRPC_ADDR": "127.0.0.1:0", "RL_RLS_CONFIG_DIR": dir})
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceparent())
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	r, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("code %v", r.OverallCode)
	}
	stop()

	tr := treeOf(rc.trace(caller.TraceID()))
	server := tr.child(t, callerSpan(), "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	if server.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("server span kind %v", server.Kind)
	}
	decide := tr.child(t, server.SpanId, "ratelimit.decide")
	if a := attrs(decide.Attributes); a["ratelimit.mode"] != "memory" || a["ratelimit.allowed"] != "true" || a["ratelimit.policy"] == "" {
		t.Errorf("decision span attributes %v", a)
	}
	if n := len(rc.spans); n != 2 {
		t.Errorf("%d spans exported, want the call's 2: %v", n, names(treeOf(rc.spans)))
	}
}

// TestTracingOff: without an exporter asked for (no OTEL_* at all, or an
// endpoint with OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none),
// nothing is installed: the public handler, the limiter and the gRPC
// server are those of a build without tracing, no global provider is set,
// and the receiver the endpoint names gets nothing.
func TestTracingOff(t *testing.T) {
	rc := startReceiver(t)
	for _, env := range []map[string]string{
		nil,
		{"OTEL_EXPORTER_OTLP_ENDPOINT": rc.srv.URL, "OTEL_SDK_DISABLED": "true"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rc.srv.URL + "/v1/traces", "OTEL_TRACES_EXPORTER": "none"},
	} {
		s, stop := startTraced(t, nil, env)
		if s.tracing != nil {
			t.Errorf("%v: tracing on", env)
		}
		if _, ok := s.public.Handler.(http.HandlerFunc); !ok {
			t.Errorf("%v: public handler %T, want the bare http.HandlerFunc", env, s.public.Handler)
		}
		if _, ok := s.limiter.(instrumented); !ok {
			t.Errorf("%v: limiter %T, want the instrumented one alone", env, s.limiter)
		}
		if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
			t.Errorf("%v: a global tracer provider is set", env)
		}
		get(t, "http://"+s.PublicAddr()+"/api/gcra", "X-API-Key", "off", "traceparent", traceparent())
		stop()
	}
	if (*tracing)(nil).grpcServerOptions() != nil {
		t.Error("gRPC options without tracing")
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.posts != 0 {
		t.Errorf("%d exports with tracing off", rc.posts)
	}
}

// TestTracingConfigErrors: a bad OTEL_* value stops the start with a
// *ConfigError naming the variable.
func TestTracingConfigErrors(t *testing.T) {
	for _, c := range []struct{ name, value string }{
		{"OTEL_SDK_DISABLED", "yes"},
		{"OTEL_TRACES_EXPORTER", "zipkin"},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://collector/v1/traces"},
		{"OTEL_EXPORTER_OTLP_HEADERS", "authorization"},
		{"OTEL_EXPORTER_OTLP_TIMEOUT", "10s"},
		{"OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"},
		{"OTEL_TRACES_SAMPLER", "jaeger_remote"},
		{"OTEL_TRACES_SAMPLER_ARG", "1.5"},
		{"OTEL_RESOURCE_ATTRIBUTES", "team"},
		{"OTEL_BSP_SCHEDULE_DELAY", "-1"},
		{"OTEL_BSP_MAX_QUEUE_SIZE", "many"},
	} {
		env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio", c.name: c.value}
		_, err := Start(context.Background(), envOf(env), io.Discard, io.Discard)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Var != c.name {
			t.Errorf("%s=%q: error %v, want a ConfigError naming it", c.name, c.value, err)
		}
	}
}

// TestTracingSettings: where the traces go for each protocol, and the
// resource's defaults and overrides.
func TestTracingSettings(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string // endpoint; "": off
	}{
		{nil, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, "http://localhost:4318/v1/traces"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "http://localhost:4317"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "https://collector:4317"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/traces"}, "http://b:4318/traces"},
		{map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318"}, "http://a:4318/v1/traces"},
	} {
		st, err := loadTracingSettings(envOf(c.env), "i-1")
		got := ""
		if st != nil {
			got = st.endpoint
		}
		if err != nil || got != c.want {
			t.Errorf("%v: endpoint %q, %v; want %q", c.env, got, err, c.want)
		}
	}
	st, err := loadTracingSettings(envOf(map[string]string{
		"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SERVICE_NAME": "edge-limiter",
		"OTEL_RESOURCE_ATTRIBUTES": "service.name=ignored,service.instance.id=pod-7,region=eu",
	}), "i-1")
	if err != nil {
		t.Fatal(err)
	}
	res := map[string]string{}
	for _, kv := range st.resource {
		res[string(kv.Key)] = kv.Value.AsString()
	}
	if res["service.name"] != "edge-limiter" || res["service.instance.id"] != "pod-7" || res["region"] != "eu" {
		t.Errorf("resource %v", res)
	}
	if st.samplerName != "parentbased_always_on" {
		t.Errorf("default sampler %s", st.samplerName)
	}
}

// BenchmarkDecisionTracing measures a decision through the service's
// limiter chain (the instrumented in-memory store): "none" is the chain
// without the tracing layer, "off" the chain Start builds with tracing off
// (the same value: nothing is wrapped), "on" with a sampled decision span
// (spans recorded and dropped, no export) and "on-unsampled" with a
// provider that samples nothing.
func BenchmarkDecisionTracing(b *testing.B) {
	base := newMetrics().instrument(memstore.New(memstore.Config{}))
	policy := ratelimit.Policy{Name: "bench", Algorithm: ratelimit.TokenBucket, Limit: 1_000_000_000, Window: time.Second}
	sampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	for _, c := range []struct {
		name string
		l    ratelimit.Limiter
	}{
		{"none", base},
		{"off", (*tracing)(nil).limiter(base)},
		{"on", (&tracing{tracer: sampled.Tracer(tracerName)}).limiter(base)},
		{"on-unsampled", (&tracing{tracer: unsampled.Tracer(tracerName)}).limiter(base)},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			req := ratelimit.Request{Policy: policy, Key: "k", Cost: 1}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.l.Decide(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
