package outbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/fencegate/fencegate/internal/jsonnames"
)

// Payload is what a kind's typed payload implements: Validate checks a
// decoded value and returns a *ValidationError naming the field
// ("payload.channel").
type Payload interface {
	Validate() error
}

// ParsePayload decodes raw into a P and validates it: the one parse a
// kind's adapter calls at execute and TypedKind's Check calls at enqueue.
// Decoding is strict: an unknown field, a field of the wrong type or
// trailing data is a *ValidationError naming the field.
//
// Names are matched exactly, at any depth, as the database's rules read
// the stored payload (payload->>'channel'): a name must be the JSON name
// of a field of the struct its object decodes into (the tag's name,
// options cut off, else the Go name; an embedded struct's fields by their
// own names; none for a field tagged "-"), so {"Channel":…} is refused
// where encoding/json alone would fill the field tagged "channel"
// ("payload.Channel: is not a field of this kind's payload (did you mean
// "channel"?)"), and a name given twice in one object is refused, where
// encoding/json takes the last. A map's keys are any names, as is
// everything inside a value of an interface type or of a type with its own
// UnmarshalJSON or UnmarshalText (json.RawMessage), but for a name given
// twice.
func ParsePayload[P Payload](raw json.RawMessage) (P, error) {
	var p P
	if err := checkNames(raw, reflect.TypeFor[P]()); err != nil {
		return p, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, decodeError(err)
	}
	if dec.More() {
		return p, invalid("payload", "must be a single JSON object")
	}
	if err := p.Validate(); err != nil {
		var v *ValidationError
		if !errors.As(err, &v) {
			err = invalid("payload", "%v", err)
		}
		return p, err
	}
	return p, nil
}

// TypedKind returns the KindSpec of a kind whose payload is P, checked
// with ParsePayload[P] (strict JSON, names matched exactly, then
// Validate), its fence policy by default fence.
func TypedKind[P Payload](fence Fence) KindSpec {
	return KindSpec{DefaultFence: fence, Check: func(raw json.RawMessage) error {
		_, err := ParsePayload[P](raw)
		return err
	}}
}

// checkNames refuses a name in raw that is not exactly one of t's JSON
// names, or is given twice in one object, naming it. Malformed JSON passes:
// the decode names it.
func checkNames(raw []byte, t reflect.Type) error {
	pr, err := jsonnames.Check(raw, t)
	if pr == nil || err != nil {
		return nil
	}
	field := "payload"
	if pr.Path != "" {
		if !strings.HasPrefix(pr.Path, "[") {
			field += "."
		}
		field += pr.Path
	}
	switch {
	case pr.Twice:
		return invalid(field, "is given twice in one JSON object; give each name once")
	case pr.Name == "":
		return invalid(field, "has a field with an empty name, which is not a field of this kind's payload")
	case pr.Want != "":
		return invalid(field, "is not a field of this kind's payload (did you mean %q?)", pr.Want)
	}
	return invalid(field, "is not a field of this kind's payload")
}

// decodeError names the field encoding/json complained about.
func decodeError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return invalid("payload", "must be a JSON object")
		}
		return invalid("payload."+te.Field, "must be %s, got JSON %s", jsonType(te.Type.String()), te.Value)
	}
	// encoding/json's message for DisallowUnknownFields: json: unknown field "x"
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return invalid("payload."+strings.Trim(name, `"`), "is not a field of this kind's payload")
	}
	return invalid("payload", "must be a JSON object: %v", err)
}

func jsonType(goType string) string {
	switch {
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"), strings.HasPrefix(goType, "float"):
		return "a number"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	}
	return fmt.Sprintf("a %s", goType)
}
