// Package admin is fencegate's HTTP API: the operator's reads and actions
// on intents and resources (package operator's), the worker intake
// (leases, epochs, fenced enqueue) for workers written in any language,
// health, readiness and metrics endpoints, and the operator's HTML pages.
//
// The intake has the same semantics as the Go library: every request runs
// the same lease.Issuer and outbox.Client calls, so the fence is checked by
// PostgreSQL in the same transaction that stores the intent, and bad input
// stores nothing. Operator reads and actions (retry, cancel, resolve, bulk)
// are package operator's, with its guarantees: an action changes an
// intent's status and records the change in its history (intent_events) in
// one transaction that holds the intent's row locked, so the status check,
// the change and the history entry are one atomic step.
//
// Requests carry bearer tokens, each with a role: worker tokens reach the
// intake, operator tokens reach reads, actions and metrics. A server without
// tokens only binds loopback addresses.
//
// The JSON API lives in api*.go; the queries and actions behind it are an
// operator.Operator's, shared with the HTML pages and with the CLI
// (`gateway ls`, `lease history`, `retry`, `cancel`, `resolve`). The
// exported names of those queries and actions in this package (Apply,
// Bulk, ListIntents, …; operator.go) are deprecated aliases of package
// operator's.
//
// The pages (pages*.go, templates/) are server-rendered with html/template
// and need no JavaScript: the intents list, an intent with its timeline and
// action forms, a resource with its epoch history. Operators sign in with a
// token kept in an HttpOnly SameSite=Strict cookie; forms carry a CSRF token
// and are refused cross-origin.
package admin
