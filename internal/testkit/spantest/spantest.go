// Package spantest records the spans a test's code makes: Install puts an
// SDK tracer provider with an in-memory recorder in place of the global
// one for the test, and puts the one before back at its end. The provider
// is global, so a test that installs one may not run in parallel.
package spantest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Install makes a recording tracer provider the global one until t ends,
// and returns its recorder and the provider (for a worker's own spans).
func Install(t testing.TB) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		otel.SetTracerProvider(prev)
		_ = tp.Shutdown(context.Background())
	})
	return rec, tp
}

// Attrs is s's attributes by key, their values as Go values (string,
// int64, bool, …).
func Attrs(s sdktrace.ReadOnlySpan) map[string]any {
	m := map[string]any{}
	for _, a := range s.Attributes() {
		m[string(a.Key)] = a.Value.AsInterface()
	}
	return m
}
