package outbox

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fencegate/fencegate/internal/kindcheck"
	"github.com/fencegate/fencegate/kinds/emailkind"
	"github.com/fencegate/fencegate/kinds/filekind"
	"github.com/fencegate/fencegate/kinds/s3kind"
	"github.com/fencegate/fencegate/kinds/webhookkind"
)

// Fence is an intent's fence policy.
type Fence string

// Fence policies.
const (
	// FenceCommit: the intent was legitimately decided while its epoch was
	// current; it is executed even if the resource moved on since.
	FenceCommit Fence = "commit"
	// FenceExecute: the epoch is checked again when the intent is executed;
	// an intent whose resource moved on is recorded as superseded.
	FenceExecute Fence = "execute"
)

// Status is an intent's status.
type Status string

// Intent statuses: pending → relayed → succeeded | failed | superseded |
// unknown | cancelled.
const (
	StatusPending    Status = "pending"
	StatusRelayed    Status = "relayed"
	StatusSucceeded  Status = "succeeded"
	StatusFailed     Status = "failed"
	StatusSuperseded Status = "superseded"
	StatusUnknown    Status = "unknown"
	StatusCancelled  Status = "cancelled"
)

// Terminal reports whether no further automatic transition follows s.
func (s Status) Terminal() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusSuperseded, StatusUnknown, StatusCancelled:
		return true
	}
	return false
}

// Effect says whether an intent's effect may have happened at its
// destination. It is kept across retries, resolves and sweeps: an intent
// whose effect is possible never ends failed (its attempts exhausted, it
// ends unknown), and an operator's retry or cancel of it must say so
// explicitly.
type Effect string

// Effects.
const (
	// EffectNone: no attempt of the intent can have reached the
	// destination, or a lookup proved, after the destination's settle
	// window, that none did.
	EffectNone Effect = "none"
	// EffectPossible: an attempt's outcome was lost (unknown), or an
	// abandoned attempt was taken over: the effect may have happened.
	EffectPossible Effect = "possible"
	// EffectDone: the effect happened (succeeded, found by a lookup, or
	// resolved succeeded by an operator).
	EffectDone Effect = "done"
)

// MaxEpoch is the largest epoch an intent may carry: 2^53, the same
// ceiling as lease.MaxEpoch (the issuer never grants more; the largest
// integer every JSON client reads exactly). Above it is bad input naming
// "epoch".
const MaxEpoch int64 = 1 << 53

// Limits on an intent's fields, in bytes.
const (
	MaxResourceLen       = 200
	MaxOperationIDLen    = 200
	MaxKindLen           = 64
	MaxIdempotencyKeyLen = 255
	// DefaultMaxPayloadBytes is Config.MaxPayloadBytes's default (256 KiB).
	DefaultMaxPayloadBytes = 256 << 10
)

// ValidateKindName checks a kind's name (a Config.Kinds key, an adapter's
// registration, an executor's Kind): 1 to MaxKindLen bytes of ASCII
// letters, digits, '_' and '-'. The name is a token of the NATS subject
// its intents are relayed on and of the JetStream consumer that takes
// them, where a space, '.', '*' or '>' is not allowed or means something
// else: an intent of kind "a b" could never be published, and the relay
// retried its batch, ahead of every other intent, until an operator
// cancelled it. The error is a *ValidationError naming field.
func ValidateKindName(field, name string) error {
	if name == "" || len(name) > MaxKindLen {
		return invalid(field, "kind name %q must be 1 to %d bytes", name, MaxKindLen)
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return invalid(field, "kind name %q may hold only ASCII letters, digits, '_' and '-' (it is a token of a NATS subject), not %q", name, rune(c))
		}
	}
	return nil
}

// Intent is a side effect a worker asks for.
type Intent struct {
	// Resource is the fenced resource the worker holds a lease on.
	Resource string `json:"resource"`
	// Epoch is the worker's fencing epoch for Resource.
	Epoch int64 `json:"epoch"`
	// OperationID identifies this enqueue among the resource's: a retry
	// with the same id is a duplicate, not a second intent.
	OperationID string `json:"operation_id"`
	// Kind selects the adapter: "email", "file", or a registered kind.
	Kind string `json:"kind"`
	// IdempotencyKey is the business key the external effect is deduplicated
	// on. Default: "<Resource>/<OperationID>". At most 255 bytes.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Fence is the fence policy. Default: the kind's (email: commit,
	// file: execute).
	Fence Fence `json:"fence,omitempty"`
	// Payload is the effect's content, a JSON object.
	Payload json.RawMessage `json:"payload"`
}

// Result is the answer to an enqueue.
type Result struct {
	IntentID int64  `json:"intent_id"`
	Status   Status `json:"status"`
	// Duplicate is true when the intent existed already (a retry).
	Duplicate bool `json:"duplicate"`
}

// Record is an intent as stored, with its progress.
type Record struct {
	IntentID       int64           `json:"intent_id"`
	Resource       string          `json:"resource"`
	Epoch          int64           `json:"epoch"`
	OperationID    string          `json:"operation_id"`
	Kind           string          `json:"kind"`
	IdempotencyKey string          `json:"idempotency_key"`
	Fence          Fence           `json:"fence"`
	Payload        json.RawMessage `json:"payload,omitempty"`
	Status         Status          `json:"status"`
	Attempts       int             `json:"attempts"`
	// Effect: whether the effect may have happened (none, possible, done).
	Effect    Effect          `json:"effect"`
	Result    json.RawMessage `json:"result"`
	LastError *string         `json:"last_error"`
	// NotBefore: a deferred retry is neither relayed again nor executed
	// before this moment (a destination's Retry-After, the runtime's
	// backoff); null when no retry is deferred.
	NotBefore   *time.Time `json:"not_before"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	RelayedAt   *time.Time `json:"relayed_at"`
	CompletedAt *time.Time `json:"completed_at"`
	// Principal is who it was enqueued as (docs/policy.md): the admin API
	// token's name ("anonymous" without tokens), the Go client's
	// Config.Principal or WithPrincipal, gateway enqueue's --principal, a
	// SQL worker's; empty when none was named.
	Principal string `json:"principal,omitempty"`
	// TraceContext is the W3C trace context of the enqueue span, if any
	// (see ContextFromTrace).
	TraceContext json.RawMessage `json:"-"`
}

// KindSpec describes an intent kind: its default fence policy and how its
// payload is checked. A kind's payload rules live in one package that its
// adapter calls too (kinds/emailkind, kinds/filekind, or your adapter's own):
// give Check its parser, the same one the adapter calls at execute, so that
// enqueue and execute cannot disagree. TypedKind builds a KindSpec from a
// payload type with a Validate method.
type KindSpec struct {
	// DefaultFence applies when an intent names none.
	DefaultFence Fence
	// Check checks the raw payload (a JSON object, within the size limit,
	// valid UTF-8); it returns a *ValidationError naming the field
	// (prefixed "payload."). When set, Validate is not used.
	Check func(payload json.RawMessage) error
	// Validate checks the decoded payload object; it returns a
	// *ValidationError naming the field (prefixed "payload."). Check is
	// the typed alternative.
	Validate func(payload map[string]any) error
}

// DefaultKinds returns the built-in kinds, email (fence commit), file
// (fence execute), webhook (fence commit) and s3 (fence execute), their
// payloads checked by their adapters' own parsers.
func DefaultKinds() map[string]KindSpec {
	return map[string]KindSpec{
		emailkind.Name: {DefaultFence: FenceCommit, Check: parsesAs(emailkind.Parse)},
		filekind.Name:  {DefaultFence: FenceExecute, Check: parsesAs(filekind.Parse)},
		// The payload's rules only: which destinations are allowed is the
		// adapter's configuration, checked by the gateway's own intake
		// (webhook.Adapter.KindSpec) and at execute.
		webhookkind.Name: {DefaultFence: FenceCommit, Check: parsesAs(webhookkind.Parse)},
		s3kind.Name:      {DefaultFence: FenceExecute, Check: parsesAs(s3kind.Parse)},
	}
}

// parsesAs is a KindSpec.Check that accepts what parse accepts.
func parsesAs[P any](parse func(json.RawMessage) (P, error)) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		_, err := parse(raw)
		return err
	}
}

// ValidateTarget checks a file target: a clean relative path inside the root.
//
// Deprecated: use filekind.ValidateTarget, where the file kind's rules live.
func ValidateTarget(target string) error { return filekind.ValidateTarget(target) }

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Message: fmt.Sprintf(format, args...)}
}

func checkID(field, v string, max int) error {
	switch {
	case v == "":
		return invalid(field, "must not be empty")
	case len(v) > max:
		return invalid(field, "must be at most %d bytes, got %d", max, len(v))
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
		return invalid(field, "must be valid UTF-8 without NUL characters")
	}
	if r, ok := kindcheck.Invisible(v); ok {
		return invalid(field, "must not contain control or format characters, got %U", r)
	}
	return nil
}

// KeyScope is how far an idempotency key reaches (Config.KeyScope).
type KeyScope string

const (
	// KeyScopeGlobal: the key as given, unique per kind across resources.
	KeyScopeGlobal KeyScope = "global"
	// KeyScopeResource: the effective key is ScopedKey(resource, key):
	// "<bytes of resource>:<resource>/<key>", the operation id standing in
	// for a key not given. A key already scoped for the intent's resource
	// is kept as it is, so normalizing twice changes nothing. The length
	// makes it unambiguous: resource "billing" with key "eu/x" and
	// resource "billing/eu" with key "x" are two keys. A worker scoped to
	// its resources cannot claim, or learn about, another resource's keys,
	// and a key of that form given under the global scope is refused, so
	// that nobody spells one out.
	KeyScopeResource KeyScope = "resource"
)

// ScopedKey is the effective idempotency key of key under resource with
// KeyScopeResource: "<bytes of resource>:<resource>/<key>". The SQL
// interface makes the same (fencegate_scoped_key).
func ScopedKey(resource, key string) string {
	return strconv.Itoa(len(resource)) + ":" + resource + "/" + key
}

// scopedShape reports whether key has the form of a scoped key: a number
// n (1 to 3 digits, no leading zero), ':', n bytes, '/'
// (fencegate_scoped_shape).
func scopedShape(key string) bool {
	colon := strings.IndexByte(key, ':')
	if colon < 1 || colon > 3 || key[0] == '0' || strings.Trim(key[:colon], "0123456789") != "" {
		return false
	}
	n, _ := strconv.Atoi(key[:colon])
	slash := colon + 1 + n
	return slash < len(key) && key[slash] == '/'
}

// ParseKeyScope parses a --key-scope value.
func ParseKeyScope(s string) (KeyScope, error) {
	switch KeyScope(s) {
	case "", KeyScopeGlobal:
		return KeyScopeGlobal, nil
	case KeyScopeResource:
		return KeyScopeResource, nil
	}
	return "", fmt.Errorf("must be %q or %q, got %q", KeyScopeGlobal, KeyScopeResource, s)
}

// normalize validates in and fills in defaults. It touches no database.
// It is idempotent: Enqueue normalizes what Validate returned again.
func normalize(in Intent, kinds map[string]KindSpec, maxPayload int, scope KeyScope) (Intent, error) {
	if err := checkID("resource", in.Resource, MaxResourceLen); err != nil {
		return in, err
	}
	if in.Epoch < 1 {
		return in, invalid("epoch", "must be at least 1, got %d", in.Epoch)
	}
	if in.Epoch > MaxEpoch {
		return in, invalid("epoch", "must be at most %d (2^53), got %d", MaxEpoch, in.Epoch)
	}
	if err := checkID("operation_id", in.OperationID, MaxOperationIDLen); err != nil {
		return in, err
	}
	if in.Kind == "" {
		return in, invalid("kind", "must not be empty")
	}
	spec, ok := kinds[in.Kind]
	if !ok {
		return in, invalid("kind", "unknown kind %q (known: %s)", in.Kind, knownKinds(kinds))
	}
	switch in.Fence {
	case "":
		in.Fence = spec.DefaultFence
	case FenceCommit, FenceExecute:
	default:
		return in, invalid("fence", "must be %q or %q, got %q", FenceCommit, FenceExecute, in.Fence)
	}
	switch {
	case scope == KeyScopeResource:
		key := cmp.Or(in.IdempotencyKey, in.OperationID)
		if in.IdempotencyKey != "" {
			if err := checkID("idempotency_key", in.IdempotencyKey, MaxIdempotencyKeyLen); err != nil {
				return in, err
			}
		}
		if !strings.HasPrefix(key, ScopedKey(in.Resource, "")) {
			key = ScopedKey(in.Resource, key)
		}
		if len(key) > MaxIdempotencyKeyLen {
			return in, invalid("idempotency_key", "the effective key %q (key scope resource) is %d bytes, over the limit of %d; pass a shorter key", key, len(key), MaxIdempotencyKeyLen)
		}
		in.IdempotencyKey = key
	case in.IdempotencyKey == "":
		in.IdempotencyKey = in.Resource + "/" + in.OperationID
		if len(in.IdempotencyKey) > MaxIdempotencyKeyLen {
			return in, invalid("idempotency_key", "the default key \"<resource>/<operation_id>\" is %d bytes, over the limit of %d; pass a shorter key", len(in.IdempotencyKey), MaxIdempotencyKeyLen)
		}
	default:
		if err := checkID("idempotency_key", in.IdempotencyKey, MaxIdempotencyKeyLen); err != nil {
			return in, err
		}
		if scopedShape(in.IdempotencyKey) {
			return in, invalid("idempotency_key", "%q has the form of a resource-scoped key (\"<bytes>:<resource>/<key>\"), which only that resource's scoped enqueues make", in.IdempotencyKey)
		}
	}
	if len(in.Payload) == 0 {
		return in, invalid("payload", "is required (a JSON object)")
	}
	if len(in.Payload) > maxPayload {
		return in, invalid("payload", "is %d bytes, over the limit of %d", len(in.Payload), maxPayload)
	}
	if !utf8.Valid(in.Payload) {
		return in, invalid("payload", "must be valid UTF-8")
	}
	if spec.Check != nil {
		// Check decodes the payload itself (once); a kind's parser that
		// accepted something other than an object would still be refused.
		if t := bytes.TrimLeft(in.Payload, " \t\r\n"); len(t) == 0 || t[0] != '{' {
			return in, invalid("payload", "must be a JSON object")
		}
		if err := spec.Check(in.Payload); err != nil {
			return in, asInvalid(err)
		}
	} else {
		var obj map[string]any
		dec := json.NewDecoder(bytes.NewReader(in.Payload))
		dec.UseNumber()
		if err := dec.Decode(&obj); err != nil || obj == nil {
			return in, invalid("payload", "must be a JSON object")
		}
		if dec.More() {
			return in, invalid("payload", "must be a single JSON object")
		}
		if spec.Validate != nil {
			if err := spec.Validate(obj); err != nil {
				return in, asInvalid(err)
			}
		}
	}
	// PostgreSQL's jsonb cannot store NUL in strings.
	if bytes.Contains(in.Payload, []byte(`\u0000`)) {
		return in, invalid("payload", "must not contain NUL characters (\\u0000)")
	}
	return in, nil
}

// asInvalid keeps a kind's *ValidationError and makes any other error
// from its check one naming "payload": bad input either way.
func asInvalid(err error) error {
	var v *ValidationError
	if errors.As(err, &v) {
		return err
	}
	return invalid("payload", "%v", err)
}

func knownKinds(kinds map[string]KindSpec) string {
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	// small and unsorted map: sort for a stable message
	for i := 1; i < len(names); i++ {
		for j := i; j > 0 && names[j] < names[j-1]; j-- {
			names[j], names[j-1] = names[j-1], names[j]
		}
	}
	return strings.Join(names, ", ")
}
