package outbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
func ParsePayload[P Payload](raw json.RawMessage) (P, error) {
	var p P
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
// with ParsePayload[P], its fence policy by default fence.
func TypedKind[P Payload](fence Fence) KindSpec {
	return KindSpec{DefaultFence: fence, Check: func(raw json.RawMessage) error {
		_, err := ParsePayload[P](raw)
		return err
	}}
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
