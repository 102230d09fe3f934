// Package webhook is the adapter that executes "webhook" intents: one HTTP
// request per business idempotency key, to an allow-listed destination.
//
// Every request carries Idempotency-Key (the business key; the same on
// every attempt), Fencegate-Resource, Fencegate-Epoch and
// Fencegate-Intent-Id, so that a receiver can dedup retries and fence out a
// stale worker (keep the highest epoch per resource, refuse older ones,
// atomically with its write: docs/webhooks.md). With Config.Secrets it is
// signed the Standard Webhooks way: webhook-id (stable per key),
// webhook-timestamp, webhook-signature "v1,<base64 HMAC-SHA256>" by every
// secret (rotation). Each request (a lookup too) is an HTTP client span,
// the child of the runtime's execute span, whose W3C trace context it
// carries (traceparent, tracestate) when the intent has a trace; the
// signature does not cover these headers.
//
// # Credentials
//
// A header that carries a credential (webhookkind.Sensitive: Authorization,
// Cookie, X-Api-Key, …) is given in the payload as {"secret": "NAME"}, a
// secret of Config.HeaderSecrets, and the adapter sends that secret's
// value: credentials are not stored in intents. An inline value for such a
// header is refused at enqueue (webhookkind.Parse), and a name the adapter
// does not hold at enqueue through KindSpec, and at execute (failed,
// nothing sent). A secret's value never appears in a log, an error or a
// result, also when the destination's answer quotes the request: every
// text taken from an answer (the body's start in an error, a result's body
// and headers, a Location) has each value, its pieces and their common
// encodings replaced by "[redacted]" (internal/scrub). An intent stored
// before inline credentials were refused is still sent as stored, with a
// warning naming the header; its inline credential is taken out of answers
// the same way.
//
// # Outcomes
//
//   - 2xx: succeeded; the result holds the status, a safe subset of the
//     headers (Location without its query), the body (up to 64 KiB,
//     marked truncated) and elapsed_ms.
//   - 408, 425, 429, 503 (refused before it was processed): retryable,
//     no sooner than the Retry-After.
//   - Any other 5xx (500, 502, 504, …): unknown, as below; the receiver
//     (or a proxy in front of it) failed after the request arrived, and
//     may have acted on it.
//   - 409 with Fencegate-Current-Epoch above the request's epoch: the
//     receiver fenced a stale request out; superseded.
//   - 301, 307, 308 (the resource is elsewhere; redirects are never
//     followed) and other 4xx: failed.
//   - 302, 303 and other 3xx: unknown, as below (not followed; many
//     servers answer a write they performed with a redirect to its
//     result).
//   - No connection, DNS, TLS handshake, a kept-alive connection that
//     failed before any byte of the request left: retryable.
//   - A reset, a timeout or no reply after bytes of the request may have
//     reached the server: the outcome is unknown. The HTTP client never
//     sends a request again by itself (net/http would, on a new
//     connection, for a request with an Idempotency-Key): a request with a
//     body cannot be rewound by it, one without goes on a connection of
//     its own; and should it still happen, the outcome is unknown. The runtime then resends with the same key where
//     the destination is in Config.DedupsOnKey; else, where the payload has
//     a lookup_url, a GET to it decides (2xx: succeeded, found_by lookup;
//     404: not found, trusted once the settle window has passed since the
//     request); else the intent is held unknown for an operator.
//
// # Destinations
//
// Config.Allow lists host or host:port entries; a URL (or lookup_url)
// whose host is not listed is refused without connecting — at enqueue
// through the gateway's intake (KindSpec), and at execute. The address is
// checked again when the connection is made, after DNS: a loopback,
// private, link-local or otherwise internal address is refused unless that
// address itself is listed, so a listed name cannot be pointed at an
// internal service. No proxy from the environment is used; redirects are
// not followed. At most Config.MaxConcurrencyPerHost requests are in
// flight per host:port; each is bounded by the runtime's execute timeout.
package webhook
