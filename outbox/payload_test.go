package outbox_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/outbox"
)

// notePayload is a program's own kind's payload, with every shape of field
// ParsePayload reads names for.
type notePayload struct {
	Channel string                   `json:"channel"`
	Text    string                   `json:"text,omitempty"`
	Count   int                      `json:"count,string"`
	Target  *noteTarget              `json:"target"`
	Items   []noteTarget             `json:"items"`
	Pair    [2]noteTarget            `json:"pair"`
	Labels  map[string]string        `json:"labels"`
	Routes  map[string]noteTarget    `json:"routes"`
	Extra   any                      `json:"extra"`
	Raw     json.RawMessage          `json:"raw"`
	Secret  string                   `json:"-"`
	Plain   string                   // named Plain, exactly
	Deep    map[string][]*noteTarget `json:"deep"`
	noteEmbedded
	*NoteMore
}

type noteTarget struct {
	URL string `json:"url"`
}

type noteEmbedded struct {
	Priority int    `json:"priority"`
	Channel  string `json:"channel"` // shadowed by notePayload.Channel
}

// NoteMore is embedded by pointer.
type NoteMore struct {
	Tag string `json:"tag"`
}

func (p notePayload) Validate() error {
	if p.Channel == "" {
		return &outbox.ValidationError{Field: "payload.channel", Message: "must not be empty"}
	}
	return nil
}

func TestParsePayloadNamesAreExact(t *testing.T) {
	t.Parallel()
	refused := []struct {
		name, payload, field, msg string
	}{
		// The way around the database's rules: they read "a" (or no
		// channel at all), encoding/json decoded "b".
		{"case variant", `{"Channel":"x"}`, "payload.Channel", `is not a field of this kind's payload (did you mean "channel"?)`},
		{"case variant after the name", `{"channel":"a","CHANNEL":"b"}`, "payload.CHANNEL", `did you mean "channel"?`},
		{"case variant of an omitempty name", `{"channel":"a","Text":"t"}`, "payload.Text", `did you mean "text"?`},
		{"case variant of a string-option name", `{"channel":"a","COUNT":"1"}`, "payload.COUNT", `did you mean "count"?`},
		{"unknown name", `{"channel":"a","nope":1}`, "payload.nope", "is not a field of this kind's payload"},
		{"nested case variant", `{"channel":"a","target":{"URL":"x"}}`, "payload.target.URL", `did you mean "url"?`},
		{"case variant in an element", `{"channel":"a","items":[{"url":"x"},{"Url":"y"}]}`, "payload.items[1].Url", `did you mean "url"?`},
		{"case variant in an array's element", `{"channel":"a","pair":[{"url":"x"},{"uRL":"y"}]}`, "payload.pair[1].uRL", `did you mean "url"?`},
		{"case variant in a map's value", `{"channel":"a","routes":{"Any":{"URL":"x"}}}`, "payload.routes.Any.URL", `did you mean "url"?`},
		{"case variant deep", `{"channel":"a","deep":{"k":[{"url":"x"},{"URL":"y"}]}}`, "payload.deep.k[1].URL", `did you mean "url"?`},
		{"case variant of an untagged name", `{"channel":"a","plain":"p"}`, "payload.plain", `did you mean "Plain"?`},
		{"case variant of an embedded name", `{"channel":"a","Priority":1}`, "payload.Priority", `did you mean "priority"?`},
		{"case variant of a name embedded by pointer", `{"channel":"a","TAG":"x"}`, "payload.TAG", `did you mean "tag"?`},
		{"an embedded struct's Go name", `{"channel":"a","noteEmbedded":{"priority":1}}`, "payload.noteEmbedded", "is not a field"},
		{"a json:\"-\" field's Go name", `{"channel":"a","Secret":"s"}`, "payload.Secret", "is not a field"},
		{"a json:\"-\" field's tag", `{"channel":"a","-":"s"}`, "payload.-", "is not a field"},
		{"empty name", `{"channel":"a","":1}`, "payload", "empty name"},
		{"empty name nested", `{"channel":"a","target":{"":1}}`, "payload.target", "empty name"},
		{"name twice", `{"channel":"a","channel":"b"}`, "payload.channel", "given twice"},
		{"name twice nested", `{"channel":"a","target":{"url":"x","url":"y"}}`, "payload.target.url", "given twice"},
		{"name twice in an element", `{"channel":"a","items":[{"url":"x"},{"url":"x","url":"y"}]}`, "payload.items[1].url", "given twice"},
		{"map key twice", `{"channel":"a","labels":{"k":"x","k":"y"}}`, "payload.labels.k", "given twice"},
		{"name twice in a free value", `{"channel":"a","extra":{"q":1,"q":2}}`, "payload.extra.q", "given twice"},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			_, err := outbox.ParsePayload[notePayload](json.RawMessage(c.payload))
			var v *outbox.ValidationError
			if !errors.As(err, &v) || !errors.Is(err, outbox.ErrInvalid) {
				t.Fatalf("%s: err = %v, want a *ValidationError", c.payload, err)
			}
			if v.Field != c.field || !strings.Contains(v.Message, c.msg) {
				t.Fatalf("%s: err = %v, want %s: …%s…", c.payload, err, c.field, c.msg)
			}
			// The kind's intake check is the same parse.
			if err2 := outbox.TypedKind[notePayload](outbox.FenceCommit).Check(json.RawMessage(c.payload)); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("%s: TypedKind's Check = %v, ParsePayload = %v", c.payload, err2, err)
			}
		})
	}

	// Exact names at every depth are accepted; a map's keys and a free
	// value's (any, json.RawMessage) are any names.
	ok := `{"channel":"a","text":"t","count":"3","target":{"url":"u"},"items":[{"url":"i"}],` +
		`"pair":[{"url":"p0"},{"url":"p1"}],"labels":{"Any":"x","any":"y","":"z"},"routes":{"R":{"url":"r"}},` +
		`"extra":{"Whatever":{"Case":1}},"raw":{"Channel":"free"},"Plain":"pl",` +
		`"deep":{"K":[{"url":"d"},null]},"priority":7,"tag":"g"}`
	p, err := outbox.ParsePayload[notePayload](json.RawMessage(ok))
	if err != nil {
		t.Fatalf("exact names: %v", err)
	}
	if p.Channel != "a" || p.Count != 3 || p.Target.URL != "u" || p.Items[0].URL != "i" || p.Pair[1].URL != "p1" ||
		p.Labels["Any"] != "x" || p.Labels["any"] != "y" || p.Routes["R"].URL != "r" || p.Plain != "pl" ||
		p.Deep["K"][0].URL != "d" || p.Priority != 7 || p.NoteMore == nil || p.Tag != "g" || p.noteEmbedded.Channel != "" {
		t.Fatalf("exact names decoded as %+v", p)
	}
	if err := outbox.TypedKind[notePayload](outbox.FenceCommit).Check(json.RawMessage(ok)); err != nil {
		t.Fatalf("TypedKind's Check of exact names: %v", err)
	}
}

// The rest of ParsePayload is as it was: a type error, trailing data, not
// an object, and Validate's error, each naming its field.
func TestParsePayloadOtherErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ payload, field, msg string }{
		{`{"channel":1}`, "payload.channel", "must be a string, got JSON number"},
		{`{"channel":"a","target":{"url":2}}`, "payload.target.url", "must be a string"},
		{`{"channel":"a"} {}`, "payload", "must be a single JSON object"},
		{`{"channel":"a"`, "payload", "must be a JSON object"},
		{`[1]`, "payload", "must be a JSON object"},
		{`{}`, "payload.channel", "must not be empty"},
		{`{"channel":""}`, "payload.channel", "must not be empty"},
	} {
		_, err := outbox.ParsePayload[notePayload](json.RawMessage(c.payload))
		var v *outbox.ValidationError
		if !errors.As(err, &v) || v.Field != c.field || !strings.Contains(v.Message, c.msg) {
			t.Errorf("%s: err = %v, want %s: …%s…", c.payload, err, c.field, c.msg)
		}
	}
}

// Embedded fields are named as encoding/json names them: the shallower
// name wins, at the same depth a tagged one wins, and two left level are
// no field at all.
type dominanceA struct {
	Both  string
	Name  string
	Level string
}

type dominanceB struct {
	Both  string
	Other string `json:"Name"`
	Level string
}

type dominancePayload struct {
	dominanceA
	dominanceB
	Level string
}

func (dominancePayload) Validate() error { return nil }

func TestParsePayloadEmbeddedNamesAsEncodingJSON(t *testing.T) {
	t.Parallel()
	p, err := outbox.ParsePayload[dominancePayload](json.RawMessage(`{"Name":"n","Level":"l"}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Other != "n" || p.Name != "" || p.Level != "l" || p.dominanceA.Level != "" {
		t.Fatalf("decoded as %+v", p)
	}
	// "Both" is given by two embedded structs at the same depth, neither
	// tagged: encoding/json has no such field.
	_, err = outbox.ParsePayload[dominancePayload](json.RawMessage(`{"Both":"x"}`))
	var v *outbox.ValidationError
	if !errors.As(err, &v) || v.Field != "payload.Both" {
		t.Fatalf("ambiguous name: err = %v, want payload.Both refused", err)
	}
}
