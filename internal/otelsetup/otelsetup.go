// Package otelsetup configures OpenTelemetry tracing for the gateway binary
// from the standard OTEL_* environment variables. Tracing is off by default:
// it is turned on by OTEL_TRACES_EXPORTER=otlp, or by setting an OTLP
// endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
// OTEL_SDK_DISABLED=true turns it off again. The exporter is OTLP over HTTP
// and reads the rest of its settings (headers, timeouts, protocol details)
// from the same standard variables.
package otelsetup

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// Enabled reports whether the environment asks for trace export.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(getenv("OTEL_TRACES_EXPORTER")) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs the global tracer provider and the W3C trace-context
// propagator when Enabled, and returns a shutdown function that flushes
// pending spans (a no-op when tracing is off).
func Setup(ctx context.Context, getenv func(string) string, service string) (func(context.Context) error, error) {
	// The propagator is always set: a worker's trace context still flows
	// through the outbox and NATS headers even when this process exports
	// nothing.
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !Enabled(getenv) {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("otelsetup: OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}
