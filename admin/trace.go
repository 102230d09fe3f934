package admin

import (
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// intake is api for a worker intake route: the request's W3C trace
// context (traceparent, tracestate), when valid, becomes the parent of the
// spans the call makes — the enqueue span, stored with the intent and
// continued by the relay and the adapters — as a Go worker's context
// does, so that an HTTP worker's trace shows its intents.
//
// It is read after the token is checked, with the propagator the relay
// uses on NATS (propagation.TraceContext: no baggage), only when the
// request's context carries no span of its own (a server span of a
// wrapping middleware stays the parent), and used for tracing only: it
// decides nothing — not who asks, not a scope — and a malformed one is
// ignored (a new trace), never refused.
func (s *Server) intake(h handlerFunc) http.Handler {
	return s.api(RoleWorker, func(r *http.Request, p principal) (int, any, error) {
		if !trace.SpanContextFromContext(r.Context()).IsValid() {
			r = r.WithContext(propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
		}
		return h(r, p)
	})
}
