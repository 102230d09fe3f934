// Package webhookkind is the webhook kind's payload: its typed form and its
// one set of rules, used by the outbox when an intent is enqueued
// (outbox.DefaultKinds) and by the webhook adapter when it is executed.
// Which destinations are allowed is the adapter's configuration
// (webhook.Config.Allow), not a payload rule: the gateway's own intake
// checks it too (webhook.KindSpec).
//
// It is a leaf package (it imports neither outbox nor adapters), so that
// the outbox can register the kind without importing the adapter.
package webhookkind

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
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
	// headers cannot be set here.
	Headers map[string]string `json:"headers,omitempty"`
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

var fields = []string{"url", "method", "headers", "body", "body_base64", "content_type", "lookup_url"}

// Parse decodes raw and validates it. Every error is a
// *fenceerr.InvalidError naming the field ("payload.headers.X-Api-Key"). A
// field the kind does not have is refused (a misspelt "header" would
// otherwise send a request without them). On an error, the Payload holds
// what was decoded before it.
func Parse(raw json.RawMessage) (Payload, error) {
	var p Payload
	obj, err := kindcheck.Object(raw)
	if err != nil {
		return p, err
	}
	if err := kindcheck.Only(obj, "a webhook", fields); err != nil {
		return p, err
	}
	if err := kindcheck.ReadStrings(obj, kindcheck.Field{Name: "url", Dst: &p.URL}, kindcheck.Field{Name: "method", Dst: &p.Method},
		kindcheck.Field{Name: "content_type", Dst: &p.ContentType}, kindcheck.Field{Name: "lookup_url", Dst: &p.LookupURL}); err != nil {
		return p, err
	}
	if err := kindcheck.ReadOptional(obj, kindcheck.OptionalField{Name: "body_base64", Dst: &p.BodyBase64}); err != nil {
		return p, err
	}
	if p.Headers, err = kindcheck.StringMap(obj, "headers"); err != nil {
		return p, err
	}
	// body is any JSON value, null included ("body": null sends null).
	if v, ok := obj["body"]; ok {
		p.Body = v
	}
	return p, p.Validate()
}

// Validate checks p: an http(s) URL without credentials, an allowed
// method, headers that are valid and not the gateway's own, at most one
// body, a content_type exactly when the body is base64, a valid lookup URL.
func (p Payload) Validate() error {
	if err := CheckURL("payload.url", p.URL); err != nil {
		return err
	}
	if p.Method != "" && !slices.Contains(Methods, p.Method) {
		return fenceerr.Invalid("payload.method", "must be one of %s, got %q", strings.Join(Methods, ", "), p.Method)
	}
	for name, v := range p.Headers {
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
		case strings.ContainsAny(v, "\r\n\x00"):
			return fenceerr.Invalid(field, "must not contain CR, LF or NUL")
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
// without user credentials or a fragment; field names it in the error.
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
	case u.Scheme != "http" && u.Scheme != "https":
		return fenceerr.Invalid(field, "must be an http or https URL, got scheme %q", u.Scheme)
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
