// Package idempotency is fencegate's business-key store: it decides, per
// (kind, idempotency key), whether an attempt may perform an external effect,
// and records the effect's outcome, in PostgreSQL. It follows Stripe's
// idempotency keys: each step is one atomic phase (one transaction), and the
// key's state is the recovery point a later attempt resumes from.
//
// # Guarantee
//
// For one key, at most one attempt owns the key at any time, and an effect
// is started automatically at most once per ownership; a new ownership
// starts only when the previous one provably ended without the effect
// (Release), or was abandoned (its lock expired), in which case the new
// owner is told to Recover: look the outcome up at the destination before
// doing anything. A completed key answers Done with the recorded outcome to
// every later attempt with the same content; different content under the
// same key is a Conflict and is never executed. An effect whose outcome is
// unknown holds its key: it is never re-executed automatically, only after
// an operator releases it (Unhold), and then as a Recover.
//
// Every decision and every write happens in one transaction that holds the
// key's row locked, so concurrent attempts — several adapters consuming the
// same redelivered message, or different intents sharing one business key —
// are totally ordered by PostgreSQL. Expiry is judged by PostgreSQL's clock,
// never a worker's.
//
// # Protocol
//
// The adapter runtime calls Begin with the intent's kind, key, Fingerprint
// of its payload and intent id, and acts on the Decision's Outcome:
//
//   - OutcomeExecute: perform the effect, then Complete with the Decision's
//     Token (or Release if the effect definitely did not happen and may be
//     retried).
//   - OutcomeRecover: an earlier attempt was abandoned mid-flight. Look the
//     outcome up at the destination; Complete with what it says, or, when
//     the destination cannot tell, Complete with outbox.StatusUnknown (the
//     key is held) — or re-send only where the destination dedups on the
//     key itself.
//   - OutcomeDone: record the Decision's Status and Result on the intent
//     with CompleteIntent; do not execute.
//   - OutcomeBusy: do not execute; retry after RetryAfter. When the key is
//     held (Status is outbox.StatusUnknown, LockedUntil zero) retrying
//     automatically does not help: the key waits for an operator.
//   - OutcomeConflict: do not execute; fail the intent with CompleteIntent.
//
// Complete records the outcome under the key and on the intent in one
// transaction, and only while the attempt still owns the key (its token is
// the key's current token): an attempt that was taken over gets
// ErrLostOwnership and writes nothing.
//
// # Settle window
//
// A lookup that finds nothing proves that the effect did not happen only
// once the destination had time to show it. The key records the last moment
// any attempt under it could have done I/O with the destination
// (Key.LastIOAt): the owner sets it when its Execute returns (EndIO); a
// takeover sets it to the takeover time when it is unset (the abandoned
// attempt may have been doing I/O until then) and keeps it otherwise; the
// owner clears it right before new I/O (BeginIO). AwaitProof, called before
// each lookup, says whether the caller's settle window has passed since then
// (PostgreSQL's clock) and renews the owner's lock. While an intent waits
// for proof its own redelivery resumes the key (Recover with Resumed set, no
// attempt counted); any other attempt gets Busy. CheckOwner is the cheap
// check an attempt makes right before the irrevocable step of its effect.
//
// # Lock timeout
//
// An attempt that runs longer than Config.LockTimeout is treated as
// abandoned and can be taken over while still running; the new owner's
// lookup may then miss an effect that is still in flight. The runtime must
// bound each execution well below LockTimeout (or Extend the lock).
//
// # Retention
//
// Completed keys are deleted Config.Retention after completion (Sweep,
// Sweeper). After that, the same key starts a new effect: retention bounds
// how late a duplicate can arrive and still be caught. Started and held keys
// are never swept.
package idempotency
