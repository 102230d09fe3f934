package outbox

import (
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the outbox's spans.
const tracerName = "github.com/fencegate/fencegate/outbox"

// TraceContextSetting is the transaction-local PostgreSQL setting the
// intents table's trace_context column takes its default from.
const TraceContextSetting = "fencegate.trace_context"

// PrincipalSetting is the transaction-local setting the intent's
// principal column defaults to (migration 00017).
const PrincipalSetting = "fencegate.principal"

type principalKey struct{}

// WithPrincipal returns ctx carrying who asks (an admin API token's name):
// intents enqueued with it record it (Record.Principal).
func WithPrincipal(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, principalKey{}, name)
}

func principalOf(ctx context.Context) string {
	v, _ := ctx.Value(principalKey{}).(string)
	return v
}

// startEnqueueSpan starts the enqueue span and returns the W3C trace
// context to store with the intent ("" when there is no valid trace).
func startEnqueueSpan(ctx context.Context, in Intent) (context.Context, trace.Span, string) {
	ctx, span := otel.Tracer(tracerName).Start(ctx, "fencegate.enqueue",
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("fencegate.resource", in.Resource),
			attribute.Int64("fencegate.epoch", in.Epoch),
			attribute.String("fencegate.operation_id", in.OperationID),
			attribute.String("fencegate.kind", in.Kind),
		))
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, span, ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	b, err := json.Marshal(carrier)
	if err != nil {
		return ctx, span, ""
	}
	return ctx, span, string(b)
}

// endEnqueueSpan records the outcome on the span and ends it.
func endEnqueueSpan(span trace.Span, res Result, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.Int64("fencegate.intent_id", res.IntentID), attribute.Bool("fencegate.duplicate", res.Duplicate))
	}
	span.End()
}

// ContextFromTrace returns ctx carrying the remote span context stored with
// an intent (its trace_context), for the relay and the adapters to continue
// the worker's trace. An empty or bad trace context returns ctx unchanged.
func ContextFromTrace(ctx context.Context, traceContext json.RawMessage) context.Context {
	if len(traceContext) == 0 {
		return ctx
	}
	carrier := propagation.MapCarrier{}
	if err := json.Unmarshal(traceContext, &carrier); err != nil {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, carrier)
}
