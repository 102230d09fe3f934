// Package otelsetup configures OpenTelemetry tracing for the gateway binary
// from the standard OTEL_* environment variables. Tracing is off by default:
// it is turned on by OTEL_TRACES_EXPORTER (otlp or console), or by setting
// an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); OTEL_SDK_DISABLED=true and
// OTEL_TRACES_EXPORTER=none turn it off again.
//
// Once on, the exporter is the one the OpenTelemetry contrib autoexport
// package builds from the same variables (OTLP over gRPC or http/protobuf
// by OTEL_EXPORTER_OTLP_PROTOCOL or OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
// with their endpoint, header, timeout and TLS variables; console), and the
// resource comes from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"

	"github.com/fencegate/fencegate/internal/buildinfo"
)

// Enabled reports whether the environment asks for trace export.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch exp := strings.ToLower(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "":
	case "none":
		return false
	default:
		// otlp, console, or a value the exporter factory refuses: Setup
		// reports that one rather than silently exporting nothing.
		return true
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs the global tracer provider and the W3C trace-context
// propagator when Enabled, and returns a shutdown function that flushes
// pending spans (a no-op when tracing is off). service is the service.name
// used when neither OTEL_SERVICE_NAME nor a service.name in
// OTEL_RESOURCE_ATTRIBUTES names one.
//
// getenv decides only whether tracing is on; the exporter, the resource and
// the SDK's own settings (OTEL_TRACES_SAMPLER, OTEL_BSP_*) are read from the
// process environment by the OpenTelemetry packages themselves.
func Setup(ctx context.Context, getenv func(string) string, service string) (func(context.Context) error, error) {
	// OpenTelemetry's own logger and error handler, before anything of it
	// runs: their defaults print the values they complain of, an OTLP
	// endpoint with its password among them.
	installDiagnostics(os.Stderr)
	// The propagator is always set: a worker's trace context still flows
	// through the outbox and NATS headers even when this process exports
	// nothing.
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !Enabled(getenv) {
		return func(context.Context) error { return nil }, nil
	}
	res, err := newResource(ctx, service)
	if err != nil {
		return nil, err
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("otelsetup: span exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// newResource describes this process. The default service name comes
// first so that the environment's detector, applied after it, overrides it:
// resource.New merges each detector over the ones before.
func newResource(ctx context.Context, service string) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		// The build, as gateway --version and fencegate_build_info say;
		// OTEL_RESOURCE_ATTRIBUTES (WithFromEnv, after) may override it.
		resource.WithAttributes(semconv.ServiceName(service), semconv.ServiceVersion(buildinfo.Get().Version)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		// Not WithProcess: its command line would carry flags such as a
		// --database-url with its password to the collector.
		resource.WithProcessPID(),
		resource.WithProcessExecutableName(),
		resource.WithProcessRuntimeName(),
		resource.WithProcessRuntimeVersion(),
	)
	// A detector that could not read everything (no host name, say) still
	// returns the rest; only a malformed environment is an error.
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("otelsetup: resource: %w", err)
	}
	return res, nil
}
