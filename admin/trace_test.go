package admin

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegate/fencegate/internal/testkit/spantest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// An HTTP worker's trace continues through the intake as a Go worker's
// does: POST /api/v1/intents with a traceparent makes the
// fencegate.enqueue span a child of the caller's span (same trace, that
// span its remote parent), and the trace context stored with the intent,
// which the relay and the adapters continue, is in that trace. A
// malformed traceparent is ignored (a trace of its own), not refused. The
// intake ignored the header: the enqueue span started a new trace.
// Not parallel: it installs the global tracer provider.
func TestIntakeContinuesTheCallersTrace(t *testing.T) {
	rec, _ := spantest.Install(t)

	pool := testdb.New(t)
	s := newServer(t, pool, testTokens, nil)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	e := &env{t: t, pool: pool, srv: s, ts: ts, issuer: s.cfg.Issuer, ob: s.cfg.Outbox}
	e.atEpochOne("traced")

	const traceID, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	enqueue := func(op, traceparent string) (int64, sdktrace.ReadOnlySpan) {
		t.Helper()
		req, err := http.NewRequest("POST", ts.URL+"/api/v1/intents", strings.NewReader(emailIntent("traced", 1, op)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+workerSecret)
		req.Header.Set("traceparent", traceparent)
		req.Header.Set("tracestate", "vendor=opaque")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var body struct {
			IntentID int64 `json:"intent_id"`
		}
		if res.StatusCode != http.StatusCreated || json.Unmarshal(b, &body) != nil {
			t.Fatalf("enqueue with traceparent %q: %d %s", traceparent, res.StatusCode, b)
		}
		// The enqueue span ends before Enqueue returns.
		for _, sp := range rec.Ended() {
			for _, a := range sp.Attributes() {
				if sp.Name() == "fencegate.enqueue" && a.Key == "fencegate.intent_id" && a.Value.AsInt64() == body.IntentID {
					return body.IntentID, sp
				}
			}
		}
		t.Fatalf("no fencegate.enqueue span for intent %d", body.IntentID)
		return 0, nil
	}

	id, sp := enqueue("op-traced", "00-"+traceID+"-"+callerSpan+"-01")
	if sp.SpanContext().TraceID().String() != traceID || sp.Parent().SpanID().String() != callerSpan || !sp.Parent().IsRemote() {
		t.Errorf("enqueue span in trace %s, parent %s (remote %v); want trace %s, the caller's span %s as remote parent",
			sp.SpanContext().TraceID(), sp.Parent().SpanID(), sp.Parent().IsRemote(), traceID, callerSpan)
	}
	r, err := e.ob.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	stored := trace.SpanContextFromContext(outbox.ContextFromTrace(context.Background(), r.TraceContext))
	if stored.TraceID().String() != traceID || stored.SpanID() != sp.SpanContext().SpanID() {
		t.Errorf("stored trace context %s: want the enqueue span's, in trace %s", r.TraceContext, traceID)
	}

	_, sp = enqueue("op-malformed", "00-not-a-trace-01")
	if sp.Parent().IsValid() || sp.SpanContext().TraceID().String() == traceID {
		t.Errorf("a malformed traceparent: enqueue span parent %v, trace %s; want a new trace", sp.Parent(), sp.SpanContext().TraceID())
	}
}
