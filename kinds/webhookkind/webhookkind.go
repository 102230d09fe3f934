// Package webhookkind is the webhook kind's payload: its typed form and its
// one set of rules, used by the outbox when an intent is enqueued
// (outbox.DefaultKinds) and by the webhook adapter when it is executed.
// Which destinations are allowed, and which header secrets the gateway
// holds, is the adapter's configuration (webhook.Config.Allow,
// webhook.Config.HeaderSecrets), not a payload rule: the gateway's own
// intake checks them too (webhook.KindSpec).
//
// Credentials do not live in intents: a header that carries one
// (Sensitive) is given as {"secret": "NAME"}, a secret the gateway holds,
// and an inline value for it is refused. Redact hides such values in
// intents stored before that rule whenever a payload is shown.
//
// It is a leaf package (it imports neither outbox nor adapters), so that
// the outbox can register the kind without importing the adapter.
package webhookkind

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/kindcheck"
)

// Name is the kind's name.
const Name = "webhook"

// MaxURLLen is the longest url or lookup_url accepted, in bytes.
const MaxURLLen = 2048

// Methods are the methods a webhook may use; the first is the default.
var Methods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// Reserved are the headers the gateway sets itself on every request; a
// payload's headers cannot set them (nor hop-by-hop and framing headers,
// see Validate).
var Reserved = []string{
	"Idempotency-Key", "Fencegate-Resource", "Fencegate-Epoch", "Fencegate-Intent-Id",
	"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature",
}

// framing are headers net/http derives from the request itself.
var framing = []string{"Host", "Content-Type", "Content-Length", "Transfer-Encoding", "Connection",
	"Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Upgrade", "Expect"}

// Payload is a webhook intent's payload.
type Payload struct {
	// URL is the request's http or https URL, its host one the adapter
	// allows. Required.
	URL string `json:"url"`
	// Method is POST (the default), PUT, PATCH or DELETE.
	Method string `json:"method,omitempty"`
	// Headers are sent with the request (and with the lookup); the
	// gateway's own headers (Reserved), Content-Type and hop-by-hop
	// headers cannot be set here. A header that carries a credential
	// (Sensitive) names a secret the gateway holds instead of a value.
	Headers map[string]Header `json:"headers,omitempty"`
	// Body is any JSON value, sent as application/json. At most one of
	// Body and BodyBase64; neither sends no body.
	Body json.RawMessage `json:"body,omitempty"`
	// BodyBase64 is a body of any bytes (standard base64), sent with
	// ContentType (required with it).
	BodyBase64  *string `json:"body_base64,omitempty"`
	ContentType string  `json:"content_type,omitempty"`
	// LookupURL, when set, answers whether the request's effect happened:
	// a GET to it (with the same headers) that is 2xx says it did, 404 that
	// it did not. Its host must be allowed too.
	LookupURL string `json:"lookup_url,omitempty"`
}

// Header is a header's value in a payload: given inline (Value), or by
// the name of a secret the gateway holds (Secret: the webhook adapter's
// Config.HeaderSecrets, gateway run's --webhook-header-secret), whose
// value the adapter sends. In JSON, a string or {"secret": "NAME"}.
type Header struct {
	Value  string
	Secret string
}

// Inline is a header given by its value.
func Inline(value string) Header { return Header{Value: value} }

// FromSecret is a header whose value is the gateway's secret name.
func FromSecret(name string) Header { return Header{Secret: name} }

// MarshalJSON writes h as a string, or {"secret": "NAME"}.
func (h Header) MarshalJSON() ([]byte, error) {
	if h.Secret != "" {
		return json.Marshal(map[string]string{"secret": h.Secret})
	}
	return json.Marshal(h.Value)
}

// UnmarshalJSON reads a string or {"secret": "NAME"}.
func (h *Header) UnmarshalJSON(b []byte) error {
	v, err := parseHeader("payload.headers", b)
	if err != nil {
		return err
	}
	*h = v
	return nil
}

// Redacted replaces a credential's value where a payload is shown
// (Redact).
const Redacted = "(redacted)"

// MaxSecretName is the longest secret name, in bytes.
const MaxSecretName = 64

var secretName = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// CheckSecretName checks a header secret's name: 1 to MaxSecretName
// letters, digits, '_', '-' and '.'; field names it in the error.
func CheckSecretName(field, name string) error {
	if len(name) == 0 || len(name) > MaxSecretName || !secretName.MatchString(name) {
		return fenceerr.Invalid(field, "secret name %q must be 1 to %d letters, digits, '_', '-' or '.'", name, MaxSecretName)
	}
	return nil
}

// sensitiveParts are what a header's name, in lower case, contains when
// its value is a credential: Authorization and Proxy-Authorization,
// Cookie, X-Api-Key, X-Auth-Token, X-Session-Id, X-Client-Secret, …
var sensitiveParts = []string{"auth", "token", "secret", "key", "passw", "passphrase", "cookie", "session", "credential", "jwt"}

// credentialSchemes are HTTP authentication schemes: a value that starts
// with one ("Bearer …") is a credential under any header name.
var credentialSchemes = []string{"bearer", "basic", "digest", "negotiate"}

// Sensitive reports whether a header named name with the inline value
// value carries a credential: its name (case-insensitively) contains
// auth, token, secret, key, passw, passphrase, cookie, session,
// credential or jwt, or its value starts with an authentication scheme
// (Bearer, Basic, Digest, Negotiate) and a space. Such a value is refused
// inline at enqueue and redacted where a payload is shown.
func Sensitive(name, value string) bool {
	n := strings.ToLower(name)
	for _, part := range sensitiveParts {
		if strings.Contains(n, part) {
			return true
		}
	}
	// The scheme is matched in ASCII only (bytes, case folded): a
	// non-ASCII letter that lower-cases to an ASCII one in Go (İ, K) may
	// not in PostgreSQL, whose SQL interface applies this rule too.
	v := strings.TrimLeft(value, " \t")
	for _, scheme := range credentialSchemes {
		if len(v) > len(scheme) && asciiLower(v[:len(scheme)]) == scheme && (v[len(scheme)] == ' ' || v[len(scheme)] == '\t') {
			return true
		}
	}
	return false
}

// asciiLower lower-cases the ASCII letters of s, byte by byte.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

var fields = []string{"url", "method", "headers", "body", "body_base64", "content_type", "lookup_url"}

// Parse decodes raw and validates it. Every error is a
// *fenceerr.InvalidError naming the field ("payload.headers.X-Api-Key"). A
// field the kind does not have is refused (a misspelt "header" would
// otherwise send a request without them). On an error, the Payload holds
// what was decoded before it.
func Parse(raw json.RawMessage) (Payload, error) {
	p, err := decode(raw)
	if err != nil {
		return p, err
	}
	return p, p.Validate()
}

// ParseStored is Parse for a payload that is already stored, as the
// adapter executes it: an inline value of a header that carries a
// credential (Sensitive), which Parse refuses, is accepted, so that an
// intent stored before that rule still executes as it was accepted. Every
// other rule is Parse's.
func ParseStored(raw json.RawMessage) (Payload, error) {
	p, err := decode(raw)
	if err != nil {
		return p, err
	}
	return p, p.validate(false)
}

func decode(raw json.RawMessage) (Payload, error) {
	var p Payload
	obj, err := kindcheck.Fields(raw, "a webhook", fields)
	if err != nil {
		return p, err
	}
	if err := kindcheck.ReadStrings(obj, kindcheck.Field{Name: "url", Dst: &p.URL}, kindcheck.Field{Name: "method", Dst: &p.Method},
		kindcheck.Field{Name: "content_type", Dst: &p.ContentType}, kindcheck.Field{Name: "lookup_url", Dst: &p.LookupURL}); err != nil {
		return p, err
	}
	if err := kindcheck.ReadOptional(obj, kindcheck.OptionalField{Name: "body_base64", Dst: &p.BodyBase64}); err != nil {
		return p, err
	}
	if p.Headers, err = parseHeaders(obj["headers"]); err != nil {
		return p, err
	}
	// body is any JSON value, null included ("body": null sends null).
	if v, ok := obj["body"]; ok {
		p.Body = v
	}
	return p, nil
}

// parseHeaders reads the headers field: nil when absent or null, else an
// object whose values are each a string or {"secret": "NAME"}, read in
// the order of their names (the first bad one is named).
func parseHeaders(raw json.RawMessage) (map[string]Header, error) {
	if raw == nil || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, fenceerr.Invalid("payload.headers", `must be an object whose values are strings or {"secret": "NAME"}`)
	}
	out := make(map[string]Header, len(obj))
	for _, name := range slices.Sorted(maps.Keys(obj)) {
		h, err := parseHeader("payload.headers."+name, obj[name])
		if err != nil {
			return nil, err
		}
		out[name] = h
	}
	return out, nil
}

// parseHeader reads one header's value: a string, or an object with
// exactly one field, secret, a string.
func parseHeader(field string, raw json.RawMessage) (Header, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return Header{Value: s}, nil
	}
	var ref map[string]json.RawMessage
	if err := json.Unmarshal(raw, &ref); err == nil && len(ref) == 1 && ref["secret"] != nil {
		// The name's rules are Validate's; an empty one is no reference.
		if err := json.Unmarshal(ref["secret"], &s); err == nil && s != "" {
			return Header{Secret: s}, nil
		}
	}
	return Header{}, fenceerr.Invalid(field, `must be a string or {"secret": "NAME"}`)
}

// Validate checks p: an http(s) URL without credentials, an allowed
// method, headers that are valid and not the gateway's own, no credential
// given inline (Sensitive: it names a secret instead), at most one body,
// a content_type exactly when the body is base64, a valid lookup URL.
func (p Payload) Validate() error { return p.validate(true) }

func (p Payload) validate(strict bool) error {
	if err := CheckURL("payload.url", p.URL); err != nil {
		return err
	}
	if p.Method != "" && !slices.Contains(Methods, p.Method) {
		return fenceerr.Invalid("payload.method", "must be one of %s, got %q", strings.Join(Methods, ", "), p.Method)
	}
	for _, name := range slices.Sorted(maps.Keys(p.Headers)) {
		h := p.Headers[name]
		field := "payload.headers." + name
		canon := http.CanonicalHeaderKey(name)
		switch {
		case !validToken(name):
			return fenceerr.Invalid(field, "is not a valid header name")
		case slices.Contains(Reserved, canon):
			return fenceerr.Invalid(field, "is set by the gateway and cannot be overridden")
		case canon == "Content-Type":
			return fenceerr.Invalid(field, "is set from the body; give content_type with body_base64")
		case slices.Contains(framing, canon):
			return fenceerr.Invalid(field, "is a connection or framing header and cannot be set")
		case h.Secret != "":
			if err := CheckSecretName(field, h.Secret); err != nil {
				return err
			}
		case strings.ContainsAny(h.Value, "\r\n\x00"):
			return fenceerr.Invalid(field, "must not contain CR, LF or NUL")
		case strict && Sensitive(name, h.Value):
			// Never echo the value: it is the credential.
			return fenceerr.Invalid(field, `carries a credential, which must not be stored in an intent: give {"secret": "NAME"}, a secret the gateway holds (--webhook-header-secret NAME=FILE)`)
		}
	}
	switch {
	case len(p.Body) > 0 && p.BodyBase64 != nil:
		return fenceerr.Invalid("payload.body", "give at most one of body or body_base64, not both")
	case p.BodyBase64 != nil:
		if _, err := base64.StdEncoding.DecodeString(*p.BodyBase64); err != nil {
			return fenceerr.Invalid("payload.body_base64", "is not valid base64: %v", err)
		}
		if p.ContentType == "" {
			return fenceerr.Invalid("payload.content_type", "is required with body_base64")
		}
		if strings.ContainsAny(p.ContentType, "\r\n\x00") {
			return fenceerr.Invalid("payload.content_type", "must not contain CR, LF or NUL")
		}
	case p.ContentType != "":
		return fenceerr.Invalid("payload.content_type", "applies only to body_base64 (a JSON body is sent as application/json)")
	case len(p.Body) > 0 && !json.Valid(p.Body):
		return fenceerr.Invalid("payload.body", "must be a JSON value")
	}
	if p.LookupURL != "" {
		if err := CheckURL("payload.lookup_url", p.LookupURL); err != nil {
			return err
		}
	}
	return nil
}

// CheckURL checks that s is an absolute http or https URL with a host and
// without user credentials or a fragment; field names it in the error,
// which never echoes s (its query or userinfo may hold a credential).
func CheckURL(field, s string) error {
	if s == "" {
		return fenceerr.Invalid(field, "is required")
	}
	if len(s) > MaxURLLen {
		return fenceerr.Invalid(field, "must be at most %d bytes, got %d", MaxURLLen, len(s))
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fenceerr.Invalid(field, "is not a valid URL")
	case u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "" && strings.HasPrefix(s[len(u.Scheme)+1:], "//"):
		return fenceerr.Invalid(field, "must be an http or https URL, got scheme %q", u.Scheme)
	case u.Scheme != "http" && u.Scheme != "https":
		// No "scheme://": what stands before a colon may be a user name
		// (user:password@host), which is not echoed.
		return fenceerr.Invalid(field, "must be an http or https URL")
	case u.Hostname() == "":
		return fenceerr.Invalid(field, "must name a host")
	case u.User != nil:
		// Credentials in a URL end up in logs and histories; send them
		// as a header.
		return fenceerr.Invalid(field, "must not carry credentials (user:password@); send them in headers")
	case u.Fragment != "" || strings.Contains(s, "#"):
		return fenceerr.Invalid(field, "must not have a fragment")
	}
	return nil
}

// MethodOr returns p's method, POST by default.
func (p Payload) MethodOr() string {
	if p.Method == "" {
		return Methods[0]
	}
	return p.Method
}

// Content returns the body to send and its content type ("" when none).
// p must be valid (Validate).
func (p Payload) Content() ([]byte, string) {
	if p.BodyBase64 != nil {
		b, _ := base64.StdEncoding.DecodeString(*p.BodyBase64)
		return b, p.ContentType
	}
	if len(p.Body) > 0 {
		return p.Body, "application/json"
	}
	return nil, ""
}

// Redact returns raw, a stored webhook payload, for showing: the value of
// every header given inline that carries a credential (Sensitive) is
// replaced by Redacted; headers that name a secret are shown as they are
// (the name is no credential). Anything else in the payload is kept as
// stored. A payload without a headers object is returned as is; raw itself
// is never changed.
func Redact(raw json.RawMessage) json.RawMessage {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return raw
	}
	var headers map[string]json.RawMessage
	if err := json.Unmarshal(obj["headers"], &headers); err != nil || headers == nil {
		return raw
	}
	redacted := false
	for name, v := range headers {
		h, err := parseHeader("", v)
		if err == nil && h.Secret != "" {
			continue
		}
		// A value of the wrong type under a credential's name is hidden
		// too: it was stored, so it may be one.
		if Sensitive(name, h.Value) {
			headers[name] = json.RawMessage(`"` + Redacted + `"`)
			redacted = true
		}
	}
	if !redacted {
		return raw
	}
	obj["headers"] = compact(headers)
	return compact(obj)
}

// compact marshals m without escaping <, > and & (a payload is shown as
// it was given).
func compact(m map[string]json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(m) // a map of valid raw values does not fail
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// validToken reports whether s is an HTTP token (RFC 9110 §5.6.2).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}
