// Package wire fixes what travels over NATS JetStream between the dispatcher
// and the adapters: the stream, the subjects and the message headers.
//
// A message only points at an intent: PostgreSQL holds the truth, and an
// adapter loads the intent from there before acting. The headers repeat the
// intent's identity for observability and routing.
package wire

import (
	"fmt"
	"strconv"
)

// Namespace identifies one deployment (one database: one outbox, one
// epoch authority) among those sharing a NATS server or cluster. It is in
// the stream's name, the subjects, the durable consumers' names, the
// inboxes (InboxPrefix) and every message id, and in a header the adapters
// check: without it, two
// deployments on one NATS would share the stream, the second's messages
// would be swallowed by the first's duplicate window (the message ids are
// the same for the same intent id), and an adapter would load intent <id>
// from its own database for a message of the other deployment.
//
// The zero Namespace is the names before namespaces existed
// (GATEWAY_INTENTS, gateway.intents.<kind>), for tests and the upgrade
// notes only: a gateway always runs with its database's namespace.
type Namespace string

// MaxNamespaceLen is the longest namespace, in bytes.
const MaxNamespaceLen = 32

// ParseNamespace checks a namespace: 1 to 32 of a-z, 0-9, '-' and '_',
// starting with a letter or digit (valid in stream, subject, consumer
// names and message ids alike).
func ParseNamespace(s string) (Namespace, error) {
	if s == "" || len(s) > MaxNamespaceLen {
		return "", fmt.Errorf("must be 1 to %d characters, got %d", MaxNamespaceLen, len(s))
	}
	for i, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || (i > 0 && (c == '-' || c == '_'))
		if !ok {
			return "", fmt.Errorf("must be lower-case letters, digits, '-' and '_', starting with a letter or digit; got %q", s)
		}
	}
	return Namespace(s), nil
}

// Stream is the JetStream stream intents are published to:
// GATEWAY_INTENTS_<namespace>.
func (n Namespace) Stream() string {
	if n == "" {
		return legacyStream
	}
	return legacyStream + "_" + string(n)
}

// SubjectPrefix prefixes every intent subject: gateway.<namespace>.intents.
func (n Namespace) SubjectPrefix() string {
	if n == "" {
		return "gateway.intents."
	}
	return "gateway." + string(n) + ".intents."
}

// SubjectAll matches every intent subject of the namespace.
func (n Namespace) SubjectAll() string { return n.SubjectPrefix() + ">" }

// Subject returns the subject intents of kind are published on.
func (n Namespace) Subject(kind string) string { return n.SubjectPrefix() + kind }

// Durable is the durable consumer of kind's intents, given the runtime's
// prefix: <prefix><namespace>-<kind>.
func (n Namespace) Durable(prefix, kind string) string {
	if n == "" {
		return prefix + kind
	}
	return prefix + string(n) + "-" + kind
}

// InboxPrefix is the prefix of the inboxes of a gateway process's NATS
// connection, where every reply comes (the JetStream API's answers, the
// PubAcks, the messages a pull fetches): _INBOX.fencegate.<namespace>, so
// that a deployment's NATS users need subscribe permission on
// _INBOX.fencegate.<namespace>.> only, not on _INBOX.>, which would let
// them read every client's replies, other deployments' deliveries
// included. Empty for the zero Namespace: nats.go's default _INBOX.
func (n Namespace) InboxPrefix() string {
	if n == "" {
		return ""
	}
	return "_INBOX.fencegate." + string(n)
}

// MsgID is the Nats-Msg-Id of an intent's relay attempt. It is new for each
// relay attempt, so a re-relay after the relay timeout is never swallowed by
// the stream's duplicate window, while a publish retried within one attempt
// (a lost PubAck) is. The namespace keeps another deployment's intent of
// the same id apart.
func (n Namespace) MsgID(intentID int64, relay int) string {
	if n == "" {
		return fmt.Sprintf("intent-%d-relay-%d", intentID, relay)
	}
	return fmt.Sprintf("%s-intent-%d-relay-%d", n, intentID, relay)
}

const legacyStream = "GATEWAY_INTENTS"

// Header names.
const (
	HeaderIntentID       = "Fencegate-Intent-Id"
	HeaderResource       = "Fencegate-Resource"
	HeaderEpoch          = "Fencegate-Epoch"
	HeaderKind           = "Fencegate-Kind"
	HeaderIdempotencyKey = "Fencegate-Idempotency-Key"
	HeaderFence          = "Fencegate-Fence"
	// HeaderRelay is the relay attempt (1 for the first publish).
	HeaderRelay = "Fencegate-Relay"
	// HeaderNamespace is the deployment's namespace; an adapter refuses a
	// message of another.
	HeaderNamespace = "Fencegate-Namespace"
)

// ParseIntentID reads the intent id header value.
func ParseIntentID(v string) (int64, error) {
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("wire: bad %s header %q", HeaderIntentID, v)
	}
	return id, nil
}
