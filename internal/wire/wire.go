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

// Stream is the JetStream stream intents are published to.
const Stream = "GATEWAY_INTENTS"

// SubjectPrefix prefixes every intent subject: gateway.intents.<kind>.
const SubjectPrefix = "gateway.intents."

// SubjectAll matches every intent subject.
const SubjectAll = SubjectPrefix + ">"

// Subject returns the subject intents of kind are published on.
func Subject(kind string) string { return SubjectPrefix + kind }

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
)

// MsgID is the Nats-Msg-Id of an intent's relay attempt. It is new for each
// relay attempt, so a re-relay after the relay timeout is never swallowed by
// the stream's duplicate window, while a publish retried within one attempt
// (a lost PubAck) is.
func MsgID(intentID int64, relay int) string {
	return fmt.Sprintf("intent-%d-relay-%d", intentID, relay)
}

// ParseIntentID reads the intent id header value.
func ParseIntentID(v string) (int64, error) {
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("wire: bad %s header %q", HeaderIntentID, v)
	}
	return id, nil
}
