package jsonnames

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestRepeatedPaths(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		raw, path, name string
	}{
		{`{"a":1,"a":2}`, "a", "a"},
		{`{"a":1,"A":2}`, "-", ""}, // another name
		{`{"p":{"to":[1,{"x":1,"x":2}]}}`, "p.to[1].x", "x"},
		{`[{"a":1},{"a":1,"a":2}]`, "[1].a", "a"},
		{`{"":1,"":2}`, "", ""},
		{`{"p":{"":1,"":2}}`, "p", ""},
		{`{"":{"x":1,"x":2}}`, "x", "x"},
		{`{"a":{"b":1},"c":{"b":2}}`, "-", ""}, // one per object
		{`{"a":1} {"a":1,"a":2}`, "-", ""},     // the first value only
	} {
		p, err := Check([]byte(c.raw), nil)
		switch {
		case err != nil:
			t.Errorf("%s: %v", c.raw, err)
		case c.path == "-":
			if p != nil {
				t.Errorf("%s: %+v, want nothing wrong", c.raw, p)
			}
		case p == nil || p.Path != c.path || p.Name != c.name || !p.Twice:
			t.Errorf("%s: %+v, want %q twice at %q", c.raw, p, c.name, c.path)
		}
	}
	// Many names: past the few kept in a slice.
	var b bytes.Buffer
	b.WriteString("{")
	for i := range 40 {
		fmt.Fprintf(&b, `"n%d":%d,`, i, i)
	}
	b.WriteString(`"n33":0}`)
	if p, err := Check(b.Bytes(), nil); err != nil || p == nil || p.Path != "n33" {
		t.Errorf("40 names and n33 again: %+v, %v", p, err)
	}
	if _, err := Check([]byte(`{"a":`), nil); err == nil {
		t.Error("malformed JSON: no error")
	}
}

// FuzzRepeatedAsBefore checks Check(raw, nil) against the walker admin
// had before it was shared: the same name twice, at the same path.
func FuzzRepeatedAsBefore(f *testing.F) {
	for _, s := range []string{`{"a":1,"a":2}`, `{"p":{"to":[1,{"x":1,"x":2}]}}`, `{"":{"":[{"y":1,"y":1}]}}`,
		`{"":1,"":2}`, `[[{"a":{"b":1,"b":2}}]]`, `{"a":1}`, `"x"`, `{"a":[}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return
		}
		wantPath, wantOK := oldRepeatedName(raw)
		p, err := Check(raw, nil)
		gotOK := p != nil && err == nil
		if gotOK != wantOK || gotOK && p.Path != wantPath {
			t.Fatalf("%s: Check = %+v, %v; before: %q, %v", raw, p, err, wantPath, wantOK)
		}
	})
}

// oldRepeatedName is admin's repeatedName as it was (the "body" default
// left out).
func oldRepeatedName(raw json.RawMessage) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var walk func(path string) (string, bool, error)
	walk = func(path string) (string, bool, error) {
		tok, err := dec.Token()
		if err != nil {
			return "", false, err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return "", false, err
				}
				name, _ := k.(string)
				at := name
				switch {
				case name == "":
					at = path
				case path != "":
					at = path + "." + name
				}
				if seen[name] {
					return at, true, nil
				}
				seen[name] = true
				if p, ok, err := walk(at); ok || err != nil {
					return p, ok, err
				}
			}
			_, err = dec.Token()
			return "", false, err
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if p, ok, err := walk(fmt.Sprintf("%s[%d]", path, i)); ok || err != nil {
					return p, ok, err
				}
			}
			_, err = dec.Token()
			return "", false, err
		}
		return "", false, nil
	}
	p, ok, err := walk("")
	return p, ok && err == nil
}

// Types whose fields encoding/json names by its embedding rules.
type (
	Inner struct {
		X string
		Y string
	}
	Twin struct {
		X string
		Z string
	}
	MyInt  int
	myInt  int
	inner2 struct {
		Y string `json:"Y"` // tagged: wins over Inner's untagged Y at the same depth
		W string `json:"w"`
	}
	deepA struct{ Inner }
	deepB struct{ Inner }
	names struct {
		Plain    string
		Tagged   string `json:"tagged"`
		Opts     int    `json:",string"` // no name: Opts
		Dash     string `json:"-"`
		DashName string `json:"-,"` // named "-"
		Punct    string `json:"a-b.c"`
		// Names encoding/json takes as written only from Go 1.27 (before,
		// their Go names).
		Quote  string `json:"q\"b"`
		Symbol string `json:"x€y"`
		Ctrl   string `json:"c\u0001"`
		Quoted string `json:"'s,q'"`
		unexp  string
		*Inner
		Twin // X at the same depth as Inner's: neither
		MyInt
		myInt
		inner2
		deepA // their Inner twice at depth 2
		deepB
		Over string `json:"Z"` // shallower than Twin's Z
	}
	// From Go 1.27 two fields named "a" at one depth: neither.
	clash struct {
		A string `json:"a"`
		B string `json:"a\"b"`
	}
)

// TestFieldsAsEncodingJSON checks that the names of structFields are the
// names encoding/json writes (its encoder and decoder share one table).
func TestFieldsAsEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, v := range []any{names{Inner: &Inner{}}, clash{}, Inner{}, deepA{}, struct {
		deepA
		deepB
	}{}, struct{ T time.Time }{}} {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		want := slices.Sorted(maps.Keys(m))
		var got []string
		for _, f := range structFields(reflect.TypeOf(v)) {
			got = append(got, f.name)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%T: names %q, encoding/json's %q", v, got, want)
		}
	}
	_ = names{}.unexp
	_ = names{}.myInt
}

func TestCheckAgainstType(t *testing.T) {
	t.Parallel()
	type item struct {
		URL string `json:"url"`
	}
	type raw = json.RawMessage
	type payload struct {
		Items []*item                 `json:"items"`
		Map   map[string]map[int]item `json:"map"`
		Any   any                     `json:"any"`
		Raw   raw                     `json:"raw"`
		When  time.Time               `json:"when"`
		Self  *payload                `json:"self"`
	}
	typ := reflect.TypeFor[payload]()
	for _, c := range []struct {
		raw, path, name, want string
	}{
		{`{"items":[{"url":"a"},{"URL":"b"}]}`, "items[1].URL", "URL", "url"},
		{`{"map":{"a":{"1":{"Url":"x"}}}}`, "map.a.1.Url", "Url", "url"},
		{`{"self":{"self":{"ITEMS":[]}}}`, "self.self.ITEMS", "ITEMS", "items"},
		{`{"self":{"nope":1}}`, "self.nope", "nope", ""},
		{`{"":1}`, "", "", ""},
		{`{"any":{"A":1},"raw":{"B":2},"when":"2026-01-01T00:00:00Z","map":{"K":{"2":{"url":""}}}}`, "-", "", ""},
		{`{"items":{"URL":1}}`, "-", "", ""}, // not an array: the decode's type error
	} {
		p, err := Check([]byte(c.raw), typ)
		if err != nil {
			t.Fatalf("%s: %v", c.raw, err)
		}
		if c.path == "-" {
			if p != nil {
				t.Errorf("%s: %+v, want nothing wrong", c.raw, p)
			}
			continue
		}
		if p == nil || p.Path != c.path || p.Name != c.name || p.Twice || p.Want != c.want {
			t.Errorf("%s: %+v, want %q at %q (want %q)", c.raw, p, c.name, c.path, c.want)
		}
	}
}
