// Package executor is the adapter runtime: it consumes the intents the
// dispatcher relayed to JetStream and executes each through the executor
// of its kind (an adapters.Executor), at most once per business
// idempotency key, and records the outcome in PostgreSQL.
//
// The dispatcher relays; this package executes. What an adapter author
// implements or returns (Executor, Looker, Capabilities, Request, Outcome,
// the error classes, Registration) is in package adapters, which does not
// import this one: an adapter depends on the interface, not on the runtime
// that calls it.
//
// # What it guarantees
//
//   - A message only points at its intent: the runtime loads the intent
//     from PostgreSQL, skips it if it already has a final status, and never
//     executes an intent of another namespace or another kind.
//   - Fence policy execute: an intent whose resource's epoch moved on before
//     any attempt began is recorded superseded, never executed.
//   - An attempt executes only as the owner of the intent's idempotency key
//     (idempotency.Store.Begin) with a live lock, which the executor can
//     re-check right before its irrevocable step (adapters.Request's
//     StillOwner).
//   - The message is acked only after the outcome is committed in
//     PostgreSQL. A crash before that commit means redelivery, and the
//     key's state makes the redelivery look the outcome up (or hold it for
//     an operator, or resend where the destination dedups on the key)
//     instead of executing twice.
//   - An error the executor did not classify is taken as an unknown
//     outcome, never as a failure: a request that may have reached the
//     destination is never recorded as one that did not. So is a panic in
//     Execute (recovered; last_error "adapter panicked: …", the stack
//     logged at ERROR) and a status Execute may not return with no error
//     (failed, unknown). A result that is not a JSON object is recorded
//     replaced by one saying so ({"invalid_result": …}), with the status
//     the adapter reported.
//   - A lookup that finds nothing is trusted as proof that the effect did
//     not happen only once the settle window (Config.LookupSettle,
//     adapters.Capabilities.LookupSettle) has passed since the last I/O
//     with the destination; until then the key stays owned.
//   - Stop lets in-flight executions finish (each bounded by
//     Config.ExecuteTimeout): cutting an effect short would only create
//     unknown outcomes.
package executor
