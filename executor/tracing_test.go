package executor_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fencegate/fencegate/outbox"
)

// One trace shows enqueue → relay → effect: the worker's span, then the
// enqueue span stored with the intent, the dispatcher's relay span carried
// in the NATS headers, and the adapter's execution span — each the child of
// the one before, in time order, with the intent id and epoch as attributes.
// Not parallel: it installs the global tracer provider.
func TestOneTraceFromEnqueueToEffect(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })

	e := setup(t, opts{})
	wctx, worker := tp.Tracer("worker").Start(context.Background(), "nightly-report-job")
	res, err := e.Client.Enqueue(wctx, e.Intent("test", "traced-op", "traced-key", []byte(`{"mode":"ok"}`)))
	worker.End()
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.waitTerminal(t, res.IntentID); rec.Status != outbox.StatusSucceeded {
		t.Fatalf("status = %s", rec.Status)
	}
	chain := []string{"nightly-report-job", "fencegate.enqueue", "fencegate.relay", "fencegate.execute"}
	// The execution span ends when the handler returns, after the outcome
	// it records has committed (and the message is acked): the status the
	// test saw can precede it. Wait for the whole chain, bounded.
	byName := map[string]sdktrace.ReadOnlySpan{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		clear(byName)
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == worker.SpanContext().TraceID() {
				byName[s.Name()] = s
			}
		}
		if len(byName) >= len(chain) || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i, name := range chain {
		s, ok := byName[name]
		if !ok {
			t.Fatalf("span %q missing from the worker's trace; have %v", name, keys(byName))
		}
		if i == 0 {
			continue
		}
		parent := byName[chain[i-1]]
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Fatalf("span %q's parent is %s, want %q (%s)", name, s.Parent().SpanID(), chain[i-1], parent.SpanContext().SpanID())
		}
		if s.StartTime().Before(parent.StartTime()) {
			t.Fatalf("span %q starts before its parent %q", name, chain[i-1])
		}
		if i >= 1 {
			attrs := map[string]any{}
			for _, a := range s.Attributes() {
				attrs[string(a.Key)] = a.Value.AsInterface()
			}
			if attrs["fencegate.epoch"] != e.Epoch() {
				t.Fatalf("span %q epoch attribute = %v, want %d", name, attrs["fencegate.epoch"], e.Epoch())
			}
			if name != "fencegate.enqueue" || attrs["fencegate.intent_id"] != nil {
				if attrs["fencegate.intent_id"] != res.IntentID {
					t.Fatalf("span %q intent_id attribute = %v, want %d", name, attrs["fencegate.intent_id"], res.IntentID)
				}
			}
		}
	}
}

func keys(m map[string]sdktrace.ReadOnlySpan) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
