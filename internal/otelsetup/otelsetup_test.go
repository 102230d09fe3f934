package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/fencegate/fencegate/internal/buildinfo"
)

// receiver collects what an OTLP exporter sends it, over gRPC or HTTP.
type receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.ResourceSpans
}

func (r *receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	r.spans = append(r.spans, req.GetResourceSpans()...)
	r.mu.Unlock()
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// spanResources returns the resource attributes of every span received, keyed
// by the span's name.
func (r *receiver) spanResources() map[string]map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]map[string]string{}
	for _, rs := range r.spans {
		attrs := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			attrs[kv.GetKey()] = anyString(kv.GetValue())
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				out[s.GetName()] = attrs
			}
		}
	}
	return out
}

func anyString(v *commonpb.AnyValue) string {
	if s, ok := v.GetValue().(*commonpb.AnyValue_StringValue); ok {
		return s.StringValue
	}
	return v.String()
}

// startGRPCReceiver serves the OTLP trace service on a free loopback port
// and returns its endpoint URL.
func startGRPCReceiver(t *testing.T) (*receiver, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rcv := &receiver{}
	collectortrace.RegisterTraceServiceServer(srv, rcv)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return rcv, "http://" + ln.Addr().String()
}

// startHTTPReceiver serves OTLP/HTTP protobuf at /v1/traces.
func startHTTPReceiver(t *testing.T) (*receiver, string) {
	t.Helper()
	rcv := &receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = rcv.Export(r.Context(), &req)
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return rcv, srv.URL
}

// otelEnv clears every OTEL_* variable of the test's environment, so a
// developer's own settings cannot change what a test sees, then sets vars.
func otelEnv(t *testing.T, vars map[string]string) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "") // restores the value when the test ends
			os.Unsetenv(k)
		}
	}
	for k, v := range vars {
		t.Setenv(k, v)
	}
}

// exportOneSpan runs Setup from the environment, ends one span named name
// and shuts the provider down, which flushes the span to the exporter before
// it returns.
func exportOneSpan(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	shutdown, err := Setup(ctx, os.Getenv, "fencegate-gateway")
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	_, span := otel.Tracer("otelsetup-test").Start(ctx, name)
	span.End()
	if err := shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

func mustReceive(t *testing.T, rcv *receiver, name string) map[string]string {
	t.Helper()
	got := rcv.spanResources()
	t.Logf("receiver got %d span(s)", len(got))
	res, ok := got[name]
	if !ok {
		t.Fatalf("span %q not received; got %v", name, got)
	}
	return res
}

// A span exported as the OTEL_* variables say reaches a real OTLP
// receiver, over gRPC and over HTTP, with the resource they say:
// service.name from OTEL_SERVICE_NAME, else from OTEL_RESOURCE_ATTRIBUTES,
// else the gateway's default; service.version the build's (buildinfo, as
// gateway --version says); the other resource attributes beside it.
func TestSpansReachTheCollector(t *testing.T) {
	for _, c := range []struct {
		name     string
		http     bool   // OTLP over HTTP; else gRPC
		endpoint string // the variable that names the receiver
		env      map[string]string
		want     map[string]string // resource attributes
	}{
		{"service name over gRPC", false, "OTEL_EXPORTER_OTLP_ENDPOINT", map[string]string{
			"OTEL_SERVICE_NAME":           "x",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		}, map[string]string{"service.name": "x", "telemetry.sdk.language": "go", "service.version": buildinfo.Get().Version}},
		// Neither OTEL_SERVICE_NAME nor a service.name resource attribute:
		// the gateway's default name stands.
		{"resource attributes", false, "OTEL_EXPORTER_OTLP_ENDPOINT", map[string]string{
			"OTEL_RESOURCE_ATTRIBUTES":    "deployment.environment=test",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		}, map[string]string{"deployment.environment": "test", "service.name": "fencegate-gateway"}},
		{"service name from resource attributes", false, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", map[string]string{
			"OTEL_RESOURCE_ATTRIBUTES":           "service.name=from-attrs",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
		}, map[string]string{"service.name": "from-attrs"}},
		{"OTLP over HTTP", true, "OTEL_EXPORTER_OTLP_ENDPOINT", map[string]string{
			"OTEL_SERVICE_NAME":           "y",
			"OTEL_TRACES_EXPORTER":        "otlp",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		}, map[string]string{"service.name": "y"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := startGRPCReceiver
			if c.http {
				start = startHTTPReceiver
			}
			rcv, endpoint := start(t)
			env := maps.Clone(c.env)
			env[c.endpoint] = endpoint
			otelEnv(t, env)
			span := strings.ReplaceAll(c.name, " ", "-")
			exportOneSpan(t, span)
			res := mustReceive(t, rcv, span)
			for k, want := range c.want {
				if res[k] != want {
					t.Errorf("%s = %q, want %q (resource %v)", k, res[k], want, res)
				}
			}
		})
	}
}

func TestEnabled(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
	}
	for _, c := range cases {
		if got := Enabled(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("Enabled(%v) = %v, want %v", c.env, got, c.want)
		}
	}
	t.Logf("%d cases", len(cases))
}

func TestSetupRefusesAnUnknownExporterOrProtocol(t *testing.T) {
	cases := []map[string]string{
		{"OTEL_TRACES_EXPORTER": "zipkin"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
	}
	for _, env := range cases {
		otelEnv(t, env)
		if _, err := Setup(context.Background(), os.Getenv, "fencegate-gateway"); err == nil {
			t.Errorf("Setup with %v: no error", env)
		} else {
			t.Logf("%v: %v", env, err)
		}
	}
	t.Logf("%d cases", len(cases))
}

// OpenTelemetry's own diagnostics (its logger, its error handler) print
// no password: an OTLP endpoint that does not parse was printed whole by
// its default logger ("parse url" … "input"="http://u:<password>%zz@…"),
// as was a header value it could not unescape. Setup runs in a child
// process, whose stderr is what an operator sees; the diagnostic is still
// said, without the value.
func TestDiagnosticsShowNoPassword(t *testing.T) {
	if os.Getenv("OTELSETUP_DIAGNOSTICS_CHILD") == "1" {
		shutdown, err := Setup(context.Background(), os.Getenv, "fencegate-gateway")
		if err != nil {
			t.Fatalf("Setup: %v", err)
		}
		_ = shutdown(context.Background())
		return
	}
	for _, c := range []struct {
		env  map[string]string
		said string // what the diagnostic still says
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://u:PWsecret%zz@127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "parse url"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://u:PWsecret%zz@127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "parse url"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://u:PWsecret%zz@127.0.0.1:1/v1/traces"}, "parse url"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%zzPWsecret"}, "escape header value"},
	} {
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "OTEL_") {
				env = append(env, kv)
			}
		}
		env = append(env, "OTELSETUP_DIAGNOSTICS_CHILD=1")
		for k, v := range c.env {
			env = append(env, k+"="+v)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestDiagnosticsShowNoPassword$", "-test.count=1")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: child: %v\n%s", c.env, err, out)
		}
		if strings.Contains(string(out), "PWsecret") || !strings.Contains(string(out), c.said) {
			t.Errorf("%v: the child printed\n%s\nwant %q without the password", c.env, out, c.said)
		}
	}
}

// An error OpenTelemetry hands its error handler (an export's) shows its
// URL without user info or query, and a URL that does not parse not at
// all.
func TestSafeError(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]string{
		fmt.Errorf("traces export: %w", &url.Error{Op: "Post", URL: "https://u:PWsecret@collector:4318/v1/traces?token=PWsecret", Err: errors.New("connection refused")}): `traces export: Post "https://collector:4318/v1/traces?…": connection refused`,
		&url.Error{Op: "parse", URL: "http://u:PWsecret%zz@h", Err: url.EscapeError("%zz")}:                                                                               "the URL does not parse",
		fmt.Errorf("x: %w", url.EscapeError("%zP")): "x: invalid URL escape",
	} {
		if got := safeError(err); got != want {
			t.Errorf("safeError(%v) = %q, want %q", err, got, want)
		}
	}
}
