package webhook_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/internal/testkit/spantest"
	"github.com/fencegate/fencegate/outbox"
)

// The request of a webhook intent enqueued inside a worker's span carries
// the W3C trace context (traceparent) of an HTTP client span — named POST,
// kind client, with the method, the server's address and port, the URL
// without its query, the answer's status code — the child of the
// intent's fencegate.execute span, in the worker's trace: the receiver
// can continue it. The request's Standard Webhooks signature still
// verifies (it covers webhook-id, webhook-timestamp and the body, not
// the trace headers), and a traceparent the payload sets is replaced by
// the intent's. A 400 makes the client span and the execute span errors,
// neither carrying the URL's query (an API key). The request carried no
// traceparent and no client span was made.
// Not parallel: it installs the global tracer provider.
func TestRuntimeRequestCarriesTraceContext(t *testing.T) {
	rec, tp := spantest.Install(t)

	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	const apiKey = "s3cr3t-api-key-in-the-query"
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/refuse" {
			http.Error(w, "unknown customer", http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}, Secrets: []string{secret}}, adaptertest.Options{})
	ctx, worker := tp.Tracer("worker").Start(context.Background(), "nightly-report-job")
	enqueue := func(key string, p []byte) int64 {
		t.Helper()
		res, err := e.Client.Enqueue(ctx, e.Intent(webhook.Kind, key, key, p))
		if err != nil {
			t.Fatal(err)
		}
		return res.IntentID
	}
	okKey, failKey := adaptertest.UniqueKey(t), adaptertest.UniqueKey(t)+"-refused"
	okID := enqueue(okKey, payload(rc.URL+"/hook", map[string]any{
		"headers": map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}))
	failID := enqueue(failKey, payload(rc.URL+"/refuse?api_key="+apiKey, nil))
	worker.End()
	e.WaitStatus(t, okID, outbox.StatusSucceeded)
	e.WaitStatus(t, failID, outbox.StatusFailed)

	// The request's trace context is its client span's, in the worker's trace.
	got := rc.got(okKey)
	if len(got) != 1 {
		t.Fatalf("%d requests, want 1", len(got))
	}
	if err := verify(secret, got[0].Header, got[0].Body); err != nil {
		t.Errorf("the signature of the request carrying traceparent does not verify: %v", err)
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(got[0].Header)))
	if !sc.IsValid() || sc.TraceID() != worker.SpanContext().TraceID() {
		t.Fatalf("the request's traceparent %q is not in the worker's trace %s", got[0].Header.Get("traceparent"), worker.SpanContext().TraceID())
	}
	spans := waitSpans(t, rec, worker.SpanContext().TraceID(), func(s []sdktrace.ReadOnlySpan) bool {
		return len(byName(s, "POST")) == 2 && len(byName(s, "fencegate.execute")) == 2
	})
	client := byID(spans, sc.SpanID())
	if client == nil {
		t.Fatalf("no span %s (the request's traceparent) recorded", sc.SpanID())
	}
	parent := byID(spans, client.Parent().SpanID())
	if client.Name() != "POST" || client.SpanKind() != trace.SpanKindClient || parent == nil || parent.Name() != "fencegate.execute" {
		t.Fatalf("the request's span is %q (%s), its parent %v; want POST, client, the child of fencegate.execute", client.Name(), client.SpanKind(), parent)
	}
	host, port, _ := strings.Cut(rc.hostPort(), ":")
	want := map[string]string{"http.request.method": "POST", "server.address": host, "server.port": port, "url.full": rc.URL + "/hook", "http.response.status_code": "200"}
	if a := attrs(client); !subset(want, a) || client.Status().Code != codes.Unset {
		t.Errorf("client span attributes %v, status %v; want %v, unset", a, client.Status(), want)
	}

	// The refused request: errors, without the query.
	failed := byID(spans, trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.HeaderCarrier(rc.got(failKey)[0].Header))).SpanID())
	if failed == nil {
		t.Fatal("no span recorded for the refused request's traceparent")
	}
	want = map[string]string{"http.response.status_code": "400", "error.type": "400", "url.full": rc.URL + "/refuse"}
	if a := attrs(failed); !subset(want, a) || failed.Status().Code != codes.Error {
		t.Errorf("refused request's span attributes %v, status %v; want %v, error", a, failed.Status(), want)
	}
	exec := byID(spans, failed.Parent().SpanID())
	if exec == nil || exec.Status().Code != codes.Error || !strings.Contains(exec.Status().Description, "400") {
		t.Errorf("the refused intent's execute span: %v; want an error naming the 400", exec)
	}
	for _, s := range spans {
		for k, v := range attrs(s) {
			if strings.Contains(v, apiKey) {
				t.Errorf("span %s attribute %s carries the URL's query: %s", s.Name(), k, v)
			}
		}
		if strings.Contains(s.Status().Description, apiKey) {
			t.Errorf("span %s status carries the URL's query: %s", s.Name(), s.Status().Description)
		}
	}
}

// waitSpans waits until the spans ended in trace id satisfy done, and
// returns them.
func waitSpans(t *testing.T, rec *tracetest.SpanRecorder, id trace.TraceID, done func([]sdktrace.ReadOnlySpan) bool) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(adaptertest.WaitTimeout)
	for {
		var out []sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == id {
				out = append(out, s)
			}
		}
		if done(out) {
			return out
		}
		if time.Now().After(deadline) {
			var names []string
			for _, s := range out {
				names = append(names, s.Name())
			}
			t.Fatalf("spans of the trace: %v", names)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func byName(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func byID(spans []sdktrace.ReadOnlySpan, id trace.SpanID) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.SpanContext().SpanID() == id {
			return s
		}
	}
	return nil
}

// attrs are a span's attributes, as strings.
func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, a := range s.Attributes() {
		out[string(a.Key)] = a.Value.Emit()
	}
	return out
}

func subset(want, got map[string]string) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}
