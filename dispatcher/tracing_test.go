package dispatcher_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/internal/testkit/spantest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// The relay span covers the publish: it ends once the stream has stored
// the message and acknowledged it, with the messaging attributes of
// OpenTelemetry's semantic conventions. It ended when the message was
// built, before the publish, so a failed publish or a missing PubAck never
// reached it. Not parallel: it installs the global tracer provider.
func TestRelaySpanCoversThePublish(t *testing.T) {
	rec, tp := spantest.Install(t)

	e := setup(t)
	e.start(dispatcher.Config{Schema: testdb.Schema(), PollInterval: 100 * time.Millisecond})
	epoch := e.acquire("traced")
	wctx, worker := tp.Tracer("worker").Start(context.Background(), "job")
	r, err := e.ob.Enqueue(wctx, fileIntent("traced", epoch, "op", 10))
	worker.End()
	if err != nil {
		t.Fatal(err)
	}
	var msg streamMsg
	waitFor(t, 10*time.Second, "the intent in the stream", func() (bool, string) {
		for _, m := range readStream(t, e.js) {
			if m.intentID == r.IntentID {
				msg = m
				return true, ""
			}
		}
		return false, "not yet"
	})
	var relay sdktrace.ReadOnlySpan
	waitFor(t, 10*time.Second, "the relay span ended", func() (bool, string) {
		for _, s := range rec.Ended() {
			if s.Name() == "fencegate.relay" && s.SpanContext().TraceID() == worker.SpanContext().TraceID() {
				relay = s
				return true, ""
			}
		}
		return false, "not yet"
	})
	if relay.EndTime().Before(msg.stored) {
		t.Fatalf("the relay span ended at %s, before the stream stored the message at %s", relay.EndTime(), msg.stored)
	}
	attrs := spantest.Attrs(relay)
	for k, want := range map[string]any{
		"messaging.system":           "nats",
		"messaging.operation.type":   "send",
		"messaging.destination.name": msg.subject,
		"messaging.message.id":       msg.msgID,
		"fencegate.intent_id":        r.IntentID,
	} {
		if attrs[k] != want {
			t.Errorf("relay span attribute %s = %v, want %v", k, attrs[k], want)
		}
	}
	if relay.Status().Code == codes.Error {
		t.Errorf("relay span status %v after a PubAck", relay.Status())
	}
}
