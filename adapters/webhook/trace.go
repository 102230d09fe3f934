package webhook

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the adapter's HTTP client
// spans.
const tracerName = "github.com/fencegate/fencegate/adapters/webhook"

// startClientSpan starts the HTTP client span of hr (OpenTelemetry's HTTP
// semantic conventions: named by the method, kind client), the child of
// the span in hr's context — the runtime's fencegate.execute — and puts
// its W3C trace context in hr's headers (traceparent, and tracestate when
// there is one), so that the receiver continues the intent's trace.
//
// Only the trace context is sent, with the propagator the relay uses on
// NATS (propagation.TraceContext), not baggage, which would carry whatever
// a worker put in it to a third party. Nothing of it is signed: Standard
// Webhooks signs webhook-id, webhook-timestamp and the body, and a proxy on
// the way may rewrite these headers. A payload's own traceparent and
// tracestate are replaced when the intent has a trace (else sent as they
// are).
func startClientSpan(hr *http.Request) (context.Context, trace.Span) {
	host, port := hostPort(hr.URL)
	ctx, span := otel.Tracer(tracerName).Start(hr.Context(), hr.Method,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			semconv.HTTPRequestMethodKey.String(hr.Method),
			semconv.ServerAddress(host),
			semconv.ServerPort(port),
			// Without the query (where API keys travel) or credentials.
			semconv.URLFull(redact(hr.URL)),
		))
	if trace.SpanContextFromContext(ctx).IsValid() {
		hr.Header.Del("Traceparent")
		hr.Header.Del("Tracestate")
		propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(hr.Header))
	}
	return ctx, span
}

// endClientSpan ends a client span with the answer's status code (0: none
// came) or the error that ended the exchange: an Error status for an
// error (its text, which names the URL redacted) and for a 4xx or 5xx
// answer, with error.type the error's Go type or the status code.
func endClientSpan(span trace.Span, status int, cause, err error) {
	if status > 0 {
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	}
	switch {
	case err != nil:
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(cause)))
		span.SetStatus(codes.Error, err.Error())
	case status >= 400:
		span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(status)))
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

// errorType is error.type for the error of an exchange: the Go type of
// what the HTTP client returned (*net.OpError, …), "_OTHER" when none.
func errorType(cause error) string {
	if cause == nil {
		return semconv.ErrorTypeOther.Value.AsString()
	}
	return fmt.Sprintf("%T", cause)
}
