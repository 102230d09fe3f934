package executor

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// withContext returns log bound to ctx: its records reach the handler with
// ctx (slog's Info and the like pass context.Background()), so a handler
// that reads the span from the context — otelsetup.LogHandler, under
// gateway run's JSON logs — gives each line of an attempt its execute
// span's trace_id and span_id. A record logged with a context of its own
// that carries a span keeps that one.
func withContext(log *slog.Logger, ctx context.Context) *slog.Logger {
	return slog.New(ctxHandler{next: log.Handler(), ctx: ctx})
}

// ctxHandler hands every record to next with ctx, unless the record's own
// context carries a span.
type ctxHandler struct {
	next slog.Handler
	ctx  context.Context
}

func (h ctxHandler) pick(ctx context.Context) context.Context {
	if ctx != nil && trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	return h.ctx
}

func (h ctxHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(h.pick(ctx), l)
}

func (h ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.next.Handle(h.pick(ctx), r)
}

func (h ctxHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return ctxHandler{next: h.next.WithAttrs(attrs), ctx: h.ctx}
}

func (h ctxHandler) WithGroup(name string) slog.Handler {
	return ctxHandler{next: h.next.WithGroup(name), ctx: h.ctx}
}
