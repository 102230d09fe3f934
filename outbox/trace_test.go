package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/fencegate/fencegate/internal/testkit/spantest"
	"github.com/fencegate/fencegate/outbox"
)

// Enqueue stores the enqueue span's W3C trace context with the intent, in
// the caller's trace; without a trace, nothing is stored.
func TestEnqueueStoresTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "r", "A", time.Minute)

	rec, tp := spantest.Install(t)

	wctx, worker := tp.Tracer("worker").Start(ctx, "nightly-report")
	res, err := b.client.Enqueue(wctx, emailIntent("r", l.Epoch, "traced"))
	worker.End()
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.client.Get(ctx, res.IntentID)
	if err != nil {
		t.Fatal(err)
	}
	var carrier map[string]string
	if err := json.Unmarshal(got.TraceContext, &carrier); err != nil || carrier["traceparent"] == "" {
		t.Fatalf("trace context = %s (%v); want a traceparent", got.TraceContext, err)
	}
	sc := trace.SpanContextFromContext(outbox.ContextFromTrace(ctx, got.TraceContext))
	if sc.TraceID() != worker.SpanContext().TraceID() {
		t.Fatalf("stored trace %s, worker's trace %s", sc.TraceID(), worker.SpanContext().TraceID())
	}
	var enq sdktrace.ReadOnlySpan
	// The provider is global: parallel tests' enqueues end spans into the
	// same recorder while it is set. Pick the span the intent stored.
	for _, s := range rec.Ended() {
		if s.Name() == "fencegate.enqueue" && s.SpanContext().SpanID() == sc.SpanID() {
			enq = s
		}
	}
	if enq == nil || enq.Parent().SpanID() != worker.SpanContext().SpanID() {
		t.Fatalf("enqueue span missing, not a child of the worker's span, or not the stored one")
	}
	attrs := spantest.Attrs(enq)
	if attrs["fencegate.intent_id"] != res.IntentID || attrs["fencegate.epoch"] != l.Epoch {
		t.Fatalf("enqueue span attributes = %v", attrs)
	}

	// The transaction-local setting does not leak into the next enqueue:
	// one without a worker span starts its own trace.
	res2, err := b.client.Enqueue(ctx, emailIntent("r", l.Epoch, "own-trace"))
	if err != nil {
		t.Fatal(err)
	}
	got2, _ := b.client.Get(ctx, res2.IntentID)
	sc2 := trace.SpanContextFromContext(outbox.ContextFromTrace(ctx, got2.TraceContext))
	if !sc2.IsValid() || sc2.TraceID() == sc.TraceID() {
		t.Fatalf("second intent's trace %s; want its own new trace", got2.TraceContext)
	}
	// With a no-op tracer provider (what an unconfigured process has),
	// nothing is stored.
	otel.SetTracerProvider(tracenoop.NewTracerProvider())
	res3, err := b.client.Enqueue(ctx, emailIntent("r", l.Epoch, "untraced"))
	if err != nil {
		t.Fatal(err)
	}
	if got3, _ := b.client.Get(ctx, res3.IntentID); got3.TraceContext != nil {
		t.Fatalf("untraced intent has trace context %s", got3.TraceContext)
	}
}
