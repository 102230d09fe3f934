package otelsetup

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func jsonLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func TestTraceAndSpanIDsInJSONLines(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("tracelog-test").Start(context.Background(), "op")
	defer span.End()
	sc := span.SpanContext()

	var buf bytes.Buffer
	log := slog.New(NewLogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "relay")
	log.InfoContext(ctx, "in a span", "intent_id", "i1")
	log.WithGroup("g").With("k", "v").InfoContext(ctx, "grouped", "n", 1)
	log.InfoContext(context.Background(), "no span")
	log.Info("no context")

	got := jsonLines(t, &buf)
	t.Logf("%d lines: %s", len(got), buf.String())
	if len(got) != 4 {
		t.Fatalf("got %d lines, want 4", len(got))
	}
	want := map[string]any{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()}
	if l := got[0]; l["trace_id"] != want["trace_id"] || l["span_id"] != want["span_id"] || l["component"] != "relay" || l["intent_id"] != "i1" {
		t.Errorf("line in a span = %v, want trace_id %v span_id %v with its own attributes", l, want["trace_id"], want["span_id"])
	}
	// Under WithGroup the ids stay at the top level; the group keeps its
	// own attributes and the record's.
	l := got[1]
	g, _ := l["g"].(map[string]any)
	if l["trace_id"] != want["trace_id"] || l["span_id"] != want["span_id"] ||
		l["component"] != "relay" || g["k"] != "v" || g["n"] != float64(1) || g["trace_id"] != nil {
		t.Errorf("grouped line = %v, want the ids at the top level and k, n in g", l)
	}
	for _, l := range got[2:] {
		if _, ok := l["trace_id"]; ok {
			t.Errorf("line without a span has a trace_id: %v", l)
		}
		if _, ok := l["span_id"]; ok {
			t.Errorf("line without a span has a span_id: %v", l)
		}
	}
}

func TestEnabledFollowsTheWrappedHandler(t *testing.T) {
	h := NewLogHandler(slog.NewJSONHandler(&bytes.Buffer{}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if h.Enabled(context.Background(), slog.LevelInfo) {
		t.Error("info enabled under a warn handler")
	}
	if !h.Enabled(context.Background(), slog.LevelError) {
		t.Error("error not enabled under a warn handler")
	}
}
