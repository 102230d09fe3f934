package otelsetup

import (
	"context"
	"log/slog"
	"slices"

	"go.opentelemetry.io/otel/trace"
)

// LogHandler adds the current span's trace_id and span_id to slog records,
// so a JSON log line can be joined to its trace. The span comes from the
// record's context (the ctx of InfoContext and the like), whichever tracer
// provider made it: the ids are there with tracing off too when a caller's
// context carries a span.
//
// It wraps another handler and, when a record's context carries a
// valid span context, adds trace_id and span_id (lower-case hex, as in W3C
// traceparent) to the record before passing it on. The ids stay at the top
// level of the line under WithGroup too, where log pipelines look for them.
type LogHandler struct {
	next slog.Handler
	// base is the wrapped handler before the first WithGroup, and derive
	// redoes every WithAttrs and WithGroup since on a handler made from it;
	// both are nil while no group is open.
	base   slog.Handler
	derive []func(slog.Handler) slog.Handler
}

// NewLogHandler returns next wrapped.
func NewLogHandler(next slog.Handler) *LogHandler { return &LogHandler{next: next} }

// Enabled reports what the wrapped handler does.
func (h *LogHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle adds the span's ids, when there is one, and passes the record on.
func (h *LogHandler) Handle(ctx context.Context, r slog.Record) error {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return h.next.Handle(ctx, r)
	}
	ids := []slog.Attr{slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String())}
	if h.base == nil {
		// Clone: the record's attributes may share storage with another
		// handler's copy of it.
		r = r.Clone()
		r.AddAttrs(ids...)
		return h.next.Handle(ctx, r)
	}
	// A record's own attributes go into the open group: add the ids before
	// the group instead, on a handler rebuilt for this record.
	next := h.base.WithAttrs(ids)
	for _, d := range h.derive {
		next = d(next)
	}
	return next.Handle(ctx, r)
}

// WithAttrs wraps the wrapped handler's WithAttrs.
func (h *LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	n := &LogHandler{next: h.next.WithAttrs(attrs), base: h.base}
	if h.base != nil {
		n.derive = append(slices.Clip(h.derive), func(x slog.Handler) slog.Handler { return x.WithAttrs(attrs) })
	}
	return n
}

// WithGroup wraps the wrapped handler's WithGroup.
func (h *LogHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	n := &LogHandler{next: h.next.WithGroup(name), base: h.base, derive: h.derive}
	if n.base == nil {
		n.base = h.next
	}
	n.derive = append(slices.Clip(n.derive), func(x slog.Handler) slog.Handler { return x.WithGroup(name) })
	return n
}
