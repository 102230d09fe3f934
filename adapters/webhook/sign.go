package webhook

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fenceerr"
)

// Standard Webhooks (https://www.standardwebhooks.com) headers.
const (
	HeaderWebhookID        = "Webhook-Id"
	HeaderWebhookTimestamp = "Webhook-Timestamp"
	HeaderWebhookSignature = "Webhook-Signature"
)

// The gateway's own headers on every request.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderResource       = "Fencegate-Resource"
	HeaderEpoch          = "Fencegate-Epoch"
	HeaderIntentID       = "Fencegate-Intent-Id"
)

// SecretPrefix starts every signing secret: "whsec_" + base64 of the key.
const SecretPrefix = "whsec_"

// Secret is a signing key (Standard Webhooks: HMAC-SHA256).
type Secret struct{ key []byte }

// ParseSecrets parses secrets, each
// "whsec_<base64>" of a key of at least 16 bytes (Standard Webhooks
// recommends 24-64). Several secrets are for rotation: every request is signed with
// each. field names the input in errors; no error repeats a secret.
func ParseSecrets(field string, items []string) ([]Secret, error) {
	var out []Secret
	for i, item := range items {
		b64, ok := strings.CutPrefix(item, SecretPrefix)
		if !ok {
			return nil, fenceerr.Invalid(field, "secret %d must start with %q", i+1, SecretPrefix)
		}
		key, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fenceerr.Invalid(field, "secret %d is not valid base64 after %q", i+1, SecretPrefix)
		}
		if len(key) < 16 {
			return nil, fenceerr.Invalid(field, "secret %d must be at least 16 bytes (24-64 recommended), got %d", i+1, len(key))
		}
		out = append(out, Secret{key: key})
	}
	return out, nil
}

// WebhookID is the webhook-id of every request for an idempotency key:
// "msg_" and the first 26 characters of the base32 of SHA-256(key). It is
// the same for every attempt of the key, so a receiver that dedups on
// webhook-id dedups retries too.
func WebhookID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "msg_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:])[:26])
}

// Sign returns the webhook-signature header value for id, ts and body:
// "v1,<base64 HMAC-SHA256(key, id.ts.body)>" for each secret, space
// separated.
func Sign(secrets []Secret, id string, ts time.Time, body []byte) string {
	stamp := strconv.FormatInt(ts.Unix(), 10)
	sigs := make([]string, len(secrets))
	for i, s := range secrets {
		m := hmac.New(sha256.New, s.key)
		m.Write([]byte(id))
		m.Write([]byte{'.'})
		m.Write([]byte(stamp))
		m.Write([]byte{'.'})
		m.Write(body)
		sigs[i] = "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	}
	return strings.Join(sigs, " ")
}

// Errors of Verify.
var (
	ErrNoSignature  = errors.New("webhook: webhook-id, webhook-timestamp or webhook-signature missing")
	ErrBadTimestamp = errors.New("webhook: webhook-timestamp not within the tolerance")
	ErrBadSignature = errors.New("webhook: no signature matches")
)

// DefaultTolerance is how far a webhook-timestamp may be from the
// receiver's clock (Standard Webhooks: 5 minutes), against replays.
const DefaultTolerance = 5 * time.Minute

// Verify is the receiver's side, for Go receivers: it checks that h and
// body carry a valid Standard Webhooks signature by one of secrets
// (several during a rotation), with a webhook-timestamp within tolerance
// of now (zero: DefaultTolerance). Verify the raw body as received, before
// decoding it.
func Verify(secrets []Secret, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	id, stamp, sigs := h.Get(HeaderWebhookID), h.Get(HeaderWebhookTimestamp), h.Get(HeaderWebhookSignature)
	if id == "" || stamp == "" || sigs == "" {
		return ErrNoSignature
	}
	sec, err := strconv.ParseInt(stamp, 10, 64)
	if err != nil {
		return ErrBadTimestamp
	}
	if d := now.Sub(time.Unix(sec, 0)); d > cmp.Or(tolerance, DefaultTolerance) || -d > cmp.Or(tolerance, DefaultTolerance) {
		return ErrBadTimestamp
	}
	for _, s := range secrets {
		want := Sign([]Secret{s}, id, time.Unix(sec, 0), body)
		for _, got := range strings.Fields(sigs) {
			if hmac.Equal([]byte(got), []byte(want)) {
				return nil
			}
		}
	}
	return ErrBadSignature
}

// NewSecret returns a fresh random secret, "whsec_" + base64 of 32 bytes.
func NewSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return SecretPrefix + base64.StdEncoding.EncodeToString(b)
}
