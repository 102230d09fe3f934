// Package email is the adapter that executes "email" intents: it sends the
// intent's message over SMTP.
//
// Email cannot check fencing epochs, so exactly-once rests on three things
// (DESIGN.md):
//
//   - the business idempotency key, which the adapter runtime dedups on;
//   - a deterministic Message-ID derived from that key (MessageID), so every
//     attempt for one key sends the same Message-ID, which a destination can
//     dedup on and which result lookup searches for; the key itself travels
//     in an Idempotency-Key header;
//   - result lookup (Lookup), which answers "did a message with this
//     Message-ID arrive?" after an attempt whose outcome was lost.
//
// # Error classes
//
// Execute classifies every failure by the phase of the SMTP transaction in
// which it happened, because that phase decides whether the message may
// have been accepted:
//
//   - before the end-of-data marker (".") was handed to the network in
//     full — dial, greeting, EHLO, STARTTLS, AUTH, MAIL, RCPT, DATA, or
//     writing the body — the server cannot have accepted the message: a
//     4xx reply or a network error is retryable (adapters.RetryableError), a
//     5xx reply is permanent (adapters.PermanentError);
//   - after the marker was sent, a 4xx or 5xx reply still says "not
//     accepted" (retryable or permanent), but a dropped connection, a
//     timeout, a cancelled context or a garbled reply leaves the outcome
//     unknown (adapters.UnknownError): the server may have queued the
//     message and the reply was lost.
//
// The error in each case wraps a *PhaseError naming the phase and the SMTP
// reply code, if there was one.
//
// # Lookup and resend policy
//
// The Adapter always has a Lookup method (adapters.Looker), but it can only
// answer when Config.Lookup is set; otherwise it returns
// ErrLookupUnavailable. Capabilities declares Lookup only then, and
// DedupsOnKey, which the runtime uses to decide, for an unknown outcome without lookup, between
// holding the intent as "unknown" (false, the default: plain SMTP and
// Mailpit do not dedup on Message-ID) and re-sending it with the same
// Message-ID (true).
package email
