// Package operator is what an operator reads and does to fencegate's
// intents and resources: list intents, get one with its history and
// timeline, a resource's counts and epoch grants, and the actions retry,
// cancel and resolve, on one intent or on every intent a filter selects
// (bulk). An [Operator] is bound to a pool (the primary) and a schema; the
// admin API and pages and the CLI's ls, lease history, retry, cancel and
// resolve all go through it, so they answer alike.
//
// Guarantees:
//
//   - An action changes the intent's status and records the change in its
//     history (intent_events: actor, from and to status, note, the
//     intent's last error) in one transaction that holds the intent's row
//     locked, so the status check, the change and the history entry are one
//     atomic step; a refused action changes nothing. The transaction is
//     durable: an action is acknowledged only once it would survive a
//     crash.
//   - An action locks the intent's idempotency key row before the intent's
//     row, the lock order of the adapters' attempts, so the two never
//     deadlock, and no attempt starts, takes the key over or completes it
//     between the action's look at the key and its change to it.
//   - An intent whose effect is possible (an attempt's outcome was lost: the
//     effect may have happened) is never cancelled, and is retried only
//     with Force, which records in its history that the operator accepted a
//     second effect. A pending intent with an attempt in flight is not
//     cancelled: its outcome decides.
//   - A bulk action acts on each intent in a transaction of its own, so one
//     intent's locks are never held while another is changed; an intent
//     that moved on meanwhile is skipped and counted by reason, never
//     forced.
//   - A payload is returned without the credentials an intent stored
//     before they were refused at enqueue may carry inline (a webhook's
//     Authorization, Cookie, X-Api-Key, … header values: see
//     webhookkind.Sensitive): Get replaces them by "(redacted)", for the
//     API, the pages and the CLI alike. The stored intent is unchanged.
//   - Lists page by keyset on intent_id, newest first: intents committed
//     while a client pages through neither shift pages nor hide older ones.
//
// Bad input is a *fenceerr.InvalidError naming the field and changes
// nothing; an unknown intent is outbox.ErrNotFound, an unknown resource
// ErrResourceNotFound (both match fenceerr.ErrNotFound); a status that does
// not allow an action is an *InvalidStateError.
package operator
