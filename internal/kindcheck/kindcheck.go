// Package kindcheck holds the decoding steps the built-in kinds' payload
// parsers share (kinds/emailkind, kinds/filekind, kinds/s3kind,
// kinds/webhookkind): a payload is one JSON object whose fields are read
// one by one, so that a field of the wrong type is refused with an error
// naming it ("payload.subject: must be a string") rather than
// encoding/json's message, and a field that is not the kind's, spelt
// exactly, is refused naming it (Only). A JSON null is the same as an absent field. It also holds the
// characters no identifier or path may contain (Invisible), which the
// outbox and the lease issuer check too.
package kindcheck

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"

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

// Fields decodes raw as one JSON object (Object) whose every field is one
// of fields, spelt exactly (Only): the start of each kind's Parse.
func Fields(raw json.RawMessage, kind string, fields []string) (map[string]json.RawMessage, error) {
	obj, err := Object(raw)
	if err != nil {
		return nil, err
	}
	return obj, Only(obj, kind, fields)
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

// Only refuses a field of obj that is not one of fields, naming it
// ("payload.Bcc"): a misspelt field would otherwise be ignored, and a mail
// sent without the recipient it named. Names are compared exactly, as
// JSON's are: "Bcc" is not "bcc" (encoding/json's struct decoding would
// take it for it; a payload's rules do not), and the message points at
// the field it differs from only in case. With several unknown fields
// the first in byte order is named, as the SQL interface's
// fencegate_payload_only does. kind is "an email", "a file", ….
func Only(obj map[string]json.RawMessage, kind string, fields []string) error {
	names := make([]string, 0, len(obj))
	for name := range obj {
		if !slices.Contains(fields, name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	name := names[0]
	list := strings.Join(fields, ", ")
	if name == "" {
		return fenceerr.Invalid("payload", "has a field with an empty name, which is not a field of %s payload (fields: %s)", kind, list)
	}
	for _, f := range fields {
		if strings.EqualFold(f, name) {
			return fenceerr.Invalid("payload."+name, "is not a field of %s payload: field names are case-sensitive, did you mean %q? (fields: %s)", kind, f, list)
		}
	}
	return fenceerr.Invalid("payload."+name, "is not a field of %s payload (fields: %s)", kind, list)
}

// Field is a string field of a payload and where it goes.
type Field struct {
	Name string
	Dst  *string
}

// ReadStrings reads each field into its Dst ("" when absent), in order.
func ReadStrings(obj map[string]json.RawMessage, fields ...Field) error {
	for _, f := range fields {
		var err error
		if *f.Dst, _, err = String(obj, f.Name); err != nil {
			return err
		}
	}
	return nil
}

// OptionalField is a string field whose absence matters (nil when absent).
type OptionalField struct {
	Name string
	Dst  **string
}

// ReadOptional reads each field into its Dst: nil when absent.
func ReadOptional(obj map[string]json.RawMessage, fields ...OptionalField) error {
	for _, f := range fields {
		s, ok, err := String(obj, f.Name)
		if err != nil {
			return err
		}
		if ok {
			*f.Dst = &s
		}
	}
	return nil
}

// StringMap reads the field name, an object of string values; nil when
// absent.
func StringMap(obj map[string]json.RawMessage, name string) (map[string]string, error) {
	v, ok := present(obj, name)
	if !ok {
		return nil, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, fenceerr.Invalid("payload."+name, "must be an object of string values")
	}
	out := make(map[string]string, len(raw))
	for k, rv := range raw {
		var s string
		if err := json.Unmarshal(rv, &s); err != nil {
			return nil, fenceerr.Invalid("payload."+name+"."+k, "must be a string")
		}
		out[k] = s
	}
	return out, nil
}

// Invisible returns the first control character (Unicode category Cc:
// C0, DEL, C1) or format character (Cf: bidi controls such as U+202E,
// zero-width characters, U+FEFF, tags) in s, and whether there is one.
// They display as nothing, or reorder what is displayed around them
// (U+202E shows "txt.exe" as "exe.txt"), so that an id or a path reads as
// another on a page, in a log or in a terminal. The SQL interface refuses
// the same characters (fencegate_check_id, fencegate_check_target); its
// list is compared with this one character by character in a test.
func Invisible(s string) (rune, bool) {
	for _, r := range s {
		if unicode.In(r, unicode.Cc, unicode.Cf) {
			return r, true
		}
	}
	return 0, false
}
