// Package dispatcher is the relay daemon: it moves committed intents from
// PostgreSQL's outbox (the intents table) to the NATS JetStream stream
// GATEWAY_INTENTS_<namespace>, where adapters pick them up.
//
// # What it guarantees
//
//   - Every committed intent is published, whatever the order in which
//     transactions committed: the dispatcher claims `pending` rows in id order
//     by their status, never by a high-water mark, so an intent whose
//     transaction committed after a higher id's is found on the next claim.
//     Rolled-back intents are never seen.
//   - Two dispatchers never hold the same intent at once. A claim is the
//     row lock of a transaction (FOR UPDATE SKIP LOCKED) that lasts from
//     the claim to the mark: claiming writes nothing, and a row another
//     dispatcher holds is skipped. A dispatcher that dies loses its
//     sessions and with them its claims, at once; one that hangs loses
//     them after Config.ClaimTTL of silence (the transaction's idle
//     timeout). A claim written into the row (claimed_by, claim_expires_at:
//     an intent parked by a tool) is honoured until it expires.
//   - An intent becomes `relayed` only after JetStream acknowledged its
//     message (PubAck). A crash between the two leaves it `pending` with
//     its relay count, so it is published again with the same Nats-Msg-Id,
//     which the stream's duplicate window absorbs.
//   - While a claim waits for its PubAcks, an adapter that already got one
//     of its messages waits for the mark before it begins the attempt (the
//     attempt locks the intent's row): a few milliseconds, and at most
//     Config.PublishTimeout when NATS does not answer.
//   - PostgreSQL is the truth, NATS is transport. An intent still `relayed`
//     (no outcome recorded by an adapter) after Config.RelayTimeout is
//     claimed and published again with a new message id (relay_count+1), so a
//     message lost inside NATS never loses an intent. Adapters guarantee a
//     single execution of an intent relayed more than once. While the
//     intent's kind has consumers on the stream holding messages not yet
//     delivered or acked, its re-relay waits (held.go): its message may be
//     one of them, behind a backlog slower than the timeout.
//   - Publish errors and database errors back off exponentially with jitter;
//     claims that could not be published are cleared at once so another
//     dispatcher can take them.
//   - Stop returns every claim it holds: after Stop, no row is claimed by
//     this dispatcher.
//
// # Waking up
//
// The dispatcher LISTENs on the channel fencegate_intents, which the fenced
// enqueue NOTIFYs at commit, and polls every Config.PollInterval as a
// fallback (a lost notification, a listener reconnecting, re-relays, an
// enqueue with NOTIFY disabled). While a claim comes back full it claims
// again at once, from just above the highest pending id it claimed, so it
// does not walk past its own in-flight claims each time; a claim from the
// lowest id runs at every wake-up, at the end of a burst and at least every
// PollInterval, so an intent committed out of order (or a claim returned)
// waits no longer than the poll fallback.
//
// # The message
//
// Subject gateway.<namespace>.intents.<kind>; Nats-Msg-Id
// <namespace>-intent-<id>-relay-<n> (internal/wire.Namespace);
// headers from package wire (intent id, resource, epoch, kind, idempotency
// key, fence, relay number starting at 1); body: the intent's payload, for
// observability only. An adapter loads the intent from PostgreSQL before
// acting: the message only points at it.
package dispatcher
