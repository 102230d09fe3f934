// Package admin is fencegate's HTTP API: the operator's reads and actions
// on intents and resources, the worker intake (leases, epochs, fenced
// enqueue) for workers written in any language, and health, readiness and
// metrics endpoints.
//
// The intake has the same semantics as the Go library: every request runs
// the same lease.Issuer and outbox.Client calls, so the fence is checked by
// PostgreSQL in the same transaction that stores the intent, and bad input
// stores nothing. Operator actions (retry, cancel, resolve) change an
// intent's status and record the change in its history (intent_events) in
// one transaction that holds the intent's row locked, so the status check,
// the change and the history entry are one atomic step.
//
// Requests carry bearer tokens, each with a role: worker tokens reach the
// intake, operator tokens reach reads, actions and metrics. A server without
// tokens only binds loopback addresses.
//
// The JSON API lives in api*.go; the queries behind it (query.go) and the
// actions (actions.go) are plain functions over a pool, shared with
// `gateway ls` and with the HTML pages.
//
// The pages (pages*.go, templates/) are server-rendered with html/template
// and need no JavaScript: the intents list, an intent with its timeline and
// action forms, a resource with its epoch history. Operators sign in with a
// token kept in an HttpOnly SameSite=Strict cookie; forms carry a CSRF token
// and are refused cross-origin.
package admin
