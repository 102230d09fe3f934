// Package kindcheck holds the decoding steps the built-in kinds' payload
// parsers share (adapters/email/emailkind, adapters/file/filekind): a
// payload is one JSON object whose fields are read one by one, so that a
// field of the wrong type is refused with an error naming it
// ("payload.subject: must be a string") rather than encoding/json's
// message. A JSON null is the same as an absent field.
package kindcheck

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/fencegate/fencegate/fenceerr"
)

// Object decodes raw as one JSON object into its fields, undecoded.
func Object(raw json.RawMessage) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return nil, fenceerr.Invalid("payload", "must be a JSON object")
	}
	if dec.More() {
		return nil, fenceerr.Invalid("payload", "must be a single JSON object")
	}
	return obj, nil
}

func present(obj map[string]json.RawMessage, name string) (json.RawMessage, bool) {
	v, ok := obj[name]
	if !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
		return nil, false
	}
	return v, true
}

// String reads the string field name; ok is false when it is absent.
func String(obj map[string]json.RawMessage, name string) (s string, ok bool, err error) {
	v, ok := present(obj, name)
	if !ok {
		return "", false, nil
	}
	if err := json.Unmarshal(v, &s); err != nil {
		return "", true, fenceerr.Invalid("payload."+name, "must be a string")
	}
	return s, true, nil
}

// Strings reads the field name given as one string or an array of
// strings; nil when it is absent.
func Strings(obj map[string]json.RawMessage, name, what string) ([]string, error) {
	v, ok := present(obj, name)
	if !ok {
		return nil, nil
	}
	var one string
	if json.Unmarshal(v, &one) == nil {
		return []string{one}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(v, &items); err != nil {
		return nil, fenceerr.Invalid("payload."+name, "must be %s or an array of them", what)
	}
	list := make([]string, len(items))
	for i, item := range items {
		if err := json.Unmarshal(item, &list[i]); err != nil {
			return nil, fenceerr.Invalid(fmt.Sprintf("payload.%s[%d]", name, i), "must be a string")
		}
	}
	return list, nil
}

// Content checks a content given as exactly one of text and base64 (the
// payload fields "content" and "content_base64").
func Content(text, b64 *string) error {
	switch {
	case text != nil && b64 != nil:
		return fenceerr.Invalid("payload.content", "give exactly one of content or content_base64, not both")
	case text == nil && b64 == nil:
		return fenceerr.Invalid("payload.content", "one of content or content_base64 is required")
	case b64 != nil:
		if _, err := base64.StdEncoding.DecodeString(*b64); err != nil {
			return fenceerr.Invalid("payload.content_base64", "is not valid base64: %v", err)
		}
	}
	return nil
}

// Bytes returns a content that passed Content.
func Bytes(text, b64 *string) []byte {
	if text != nil {
		return []byte(*text)
	}
	if b64 == nil {
		return nil
	}
	b, _ := base64.StdEncoding.DecodeString(*b64)
	return b
}
