// Package jsonnames reads the names in a JSON value's objects, which
// encoding/json reads loosely: of a name given twice in one object it
// takes the last, and it matches a name to a struct field
// case-insensitively ({"Channel":…} and {"CHANNEL":…} both fill the field
// named "channel"). Whoever reads the same JSON otherwise (a proxy, an
// audit log, the database's rules reading payload->>'channel') would see
// another value than the Go code acts on. Check finds, in one pass over
// the tokens, a name given twice in one object at any depth and, against
// a Go type, a name that is not exactly the JSON name of a field of the
// struct its object decodes into. admin checks request bodies with it,
// outbox.ParsePayload a program's own kinds' payloads.
package jsonnames

import (
	"bytes"
	"cmp"
	"encoding"
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
)

// Problem is the first wrong name of a JSON value, in document order.
type Problem struct {
	// Path is where the name is: the names from the value's root joined
	// with ".", an element's index in brackets ("to", "payload.to[1]",
	// "items[0].url"). For an empty name it is the path of the object
	// holding it ("" at the root): there is no name to point at.
	Path string
	// Name is the name as the JSON gives it.
	Name string
	// Twice is true when the name was given before in the same object;
	// otherwise it is not the name of a field of the struct the object
	// decodes into.
	Twice bool
	// Want is the name of the field that Name matches case-insensitively,
	// if one does: what encoding/json would have filled.
	Want string
}

// Check reads raw, one JSON value (what follows it is not read), and
// returns its first wrong name, or nil. With t nil, or where a value
// decodes into an interface, a map's keys or a type that decodes itself
// (json.Unmarshaler, encoding.TextUnmarshaler: json.RawMessage, time.Time),
// any name is right but one given twice. Otherwise an object that decodes
// into a struct (through pointers, slices, arrays and maps' values) may
// give only its fields' names, as encoding/json names them: the tag's name
// (options such as omitempty cut off), else the Go name; none for a field
// tagged "-" or unexported; an embedded struct's fields promoted, the
// shallower and then the tagged one winning, two left level meaning none.
// (A tag whose name encoding/json does not take as written, with a quote
// or a symbol, names the field by its Go name before Go 1.27 and by a part
// of the tag after: the name is the running encoding/json's.) The table of
// a type's names is computed once. err is raw's syntax error, which a
// decode of raw reports anyway.
func Check(raw []byte, t reflect.Type) (*Problem, error) {
	w := walker{dec: json.NewDecoder(bytes.NewReader(raw))}
	w.dec.UseNumber() // numbers are skipped: don't parse them
	return w.value(t)
}

// A step is one step of the path from the root: an object's name or an
// array's index. The path is written out only for a problem.
type step struct {
	name  string
	index int // -1 for a name
}

type walker struct {
	dec  *json.Decoder
	path []step
}

func (w *walker) problem(name string, twice bool, want string) *Problem {
	var b strings.Builder
	for _, s := range w.path {
		switch {
		case s.index >= 0:
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
		case s.name == "":
			// no name to point at: its object's path
		default:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s.name)
		}
	}
	return &Problem{Path: b.String(), Name: name, Twice: twice, Want: want}
}

// value reads one value, which decodes into t (nil: anything).
func (w *walker) value(t reflect.Type) (*Problem, error) {
	tok, err := w.dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		s := shapeOf(t)
		var seen []string           // the names so far, while few
		var seenSet map[string]bool // then
		for w.dec.More() {
			k, err := w.dec.Token()
			if err != nil {
				return nil, err
			}
			name, _ := k.(string)
			w.path = append(w.path, step{name: name, index: -1})
			switch {
			case seenSet != nil:
				if seenSet[name] {
					return w.problem(name, true, ""), nil
				}
				seenSet[name] = true
			case slices.Contains(seen, name):
				return w.problem(name, true, ""), nil
			case len(seen) < 16:
				seen = append(seen, name)
			default:
				seenSet = make(map[string]bool, 2*len(seen))
				for _, n := range seen {
					seenSet[n] = true
				}
				seenSet[name] = true
			}
			var elem reflect.Type
			switch s.kind {
			case object:
				f, ok := s.fields[name]
				if !ok {
					return w.problem(name, false, s.fold(name)), nil
				}
				elem = f
			case mapping:
				elem = s.elem
			}
			if p, err := w.value(elem); p != nil || err != nil {
				return p, err
			}
			w.path = w.path[:len(w.path)-1]
		}
		_, err = w.dec.Token() // }
		return nil, err
	case json.Delim('['):
		s := shapeOf(t)
		var elem reflect.Type
		if s.kind == list {
			elem = s.elem
		}
		for i := 0; w.dec.More(); i++ {
			w.path = append(w.path, step{index: i})
			if p, err := w.value(elem); p != nil || err != nil {
				return p, err
			}
			w.path = w.path[:len(w.path)-1]
		}
		_, err = w.dec.Token() // ]
		return nil, err
	}
	return nil, nil
}

type kind uint8

const (
	free    kind = iota // any names
	object              // a struct's fields
	mapping             // a map's keys, values of elem
	list                // a slice's or array's elements, of elem
)

// shape is what an object or array decoding into a type may hold.
type shape struct {
	kind   kind
	fields map[string]reflect.Type // object: each field's JSON name, its type
	names  []string                // object: the names in the fields' order
	elem   reflect.Type            // mapping, list
}

// fold returns the field name that name matches case-insensitively, the
// first in the fields' order as encoding/json takes it, or "".
func (s *shape) fold(name string) string {
	for _, n := range s.names {
		if strings.EqualFold(n, name) {
			return n
		}
	}
	return ""
}

var (
	freeShape = &shape{kind: free}
	shapes    sync.Map // reflect.Type → *shape, each computed once

	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func shapeOf(t reflect.Type) *shape {
	if t == nil {
		return freeShape
	}
	if s, ok := shapes.Load(t); ok {
		return s.(*shape)
	}
	s, _ := shapes.LoadOrStore(t, newShape(t))
	return s.(*shape)
}

func newShape(t reflect.Type) *shape {
	for {
		// A type that decodes itself reads its own names.
		if decodesItself(t) || decodesItself(reflect.PointerTo(t)) {
			return freeShape
		}
		if t.Kind() != reflect.Pointer {
			break
		}
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		s := &shape{kind: object, fields: map[string]reflect.Type{}}
		for _, f := range structFields(t) {
			s.fields[f.name] = f.typ
			s.names = append(s.names, f.name)
		}
		return s
	case reflect.Map:
		return &shape{kind: mapping, elem: t.Elem()}
	case reflect.Slice, reflect.Array:
		return &shape{kind: list, elem: t.Elem()}
	}
	return freeShape
}

func decodesItself(t reflect.Type) bool {
	return t.Implements(unmarshalerType) || t.Implements(textUnmarshalerType)
}

type field struct {
	name   string
	tagged bool
	index  []int
	typ    reflect.Type
}

// structFields returns the fields encoding/json decodes into in a struct
// of type t, in their order: its typeFields (encode.go) without what
// only encoding needs.
func structFields(t reflect.Type) []field {
	current := []field{}
	next := []field{{typ: t}}
	var count, nextCount map[reflect.Type]int
	visited := map[reflect.Type]bool{}
	var fields []field
	for len(next) > 0 {
		current, next = next, current[:0]
		count, nextCount = nextCount, map[reflect.Type]int{}
		for _, f := range current {
			if visited[f.typ] {
				continue
			}
			visited[f.typ] = true
			for i := range f.typ.NumField() {
				sf := f.typ.Field(i)
				if sf.Anonymous {
					et := sf.Type
					if et.Kind() == reflect.Pointer {
						et = et.Elem()
					}
					if !sf.IsExported() && et.Kind() != reflect.Struct {
						continue // an unexported non-struct: nothing to promote
					}
				} else if !sf.IsExported() {
					continue
				}
				tag := sf.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, _, _ := strings.Cut(tag, ",")
				if name != "" && !validTag(name) {
					// encoding/json names such a field by its Go name
					// before Go 1.27 and by a part of the tag after: ask
					// it. It may refuse the tag: then the field has no
					// name (and its type cannot be decoded into).
					var tagged, ok bool
					if name, tagged, ok = oddTagName(sf.Tag); !ok {
						continue
					}
					if !tagged {
						name = ""
					}
				}
				index := append(slices.Clone(f.index), i)
				ft := sf.Type
				if ft.Name() == "" && ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if name != "" || !sf.Anonymous || ft.Kind() != reflect.Struct {
					tagged := name != ""
					if name == "" {
						name = sf.Name
					}
					fields = append(fields, field{name: name, tagged: tagged, index: index, typ: sf.Type})
					if count[f.typ] > 1 {
						// The struct is embedded twice at this depth: a
						// second copy makes its fields ambiguous below.
						fields = append(fields, fields[len(fields)-1])
					}
					continue
				}
				// An embedded struct without a name: its fields, next round.
				nextCount[ft]++
				if nextCount[ft] == 1 {
					next = append(next, field{name: ft.Name(), index: index, typ: ft})
				}
			}
		}
	}

	slices.SortFunc(fields, func(a, b field) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		if c := cmp.Compare(len(a.index), len(b.index)); c != 0 {
			return c
		}
		if a.tagged != b.tagged {
			if a.tagged {
				return -1
			}
			return +1
		}
		return slices.Compare(a.index, b.index)
	})
	// Of the fields of one name, the shallowest wins, then the tagged one;
	// two left level are none.
	out := fields[:0]
	for i := 0; i < len(fields); {
		n := 1
		for i+n < len(fields) && fields[i+n].name == fields[i].name {
			n++
		}
		if n == 1 || len(fields[i].index) != len(fields[i+1].index) || fields[i].tagged != fields[i+1].tagged {
			out = append(out, fields[i])
		}
		i += n
	}
	slices.SortFunc(out, func(a, b field) int { return slices.Compare(a.index, b.index) })
	return out
}

// oddTagName returns the name encoding/json gives a field tagged tag
// whose name part it does not take as written, and whether the tag names
// it (false: its Go name does), by marshaling one-field structs with the
// tag. ok is false when encoding/json refuses the tag.
func oddTagName(tag reflect.StructTag) (name string, tagged, ok bool) {
	probe := func(goName string) (string, bool) {
		t := reflect.StructOf([]reflect.StructField{{Name: goName, Type: reflect.TypeFor[string](), Tag: tag}})
		v := reflect.New(t).Elem()
		v.Field(0).SetString("x") // not empty: omitempty, omitzero
		b, err := json.Marshal(v.Interface())
		var m map[string]json.RawMessage
		if err != nil || json.Unmarshal(b, &m) != nil || len(m) != 1 {
			return "", false
		}
		for k := range m {
			return k, true
		}
		return "", false
	}
	f, ok1 := probe("F")
	g, ok2 := probe("G")
	switch {
	case !ok1 || !ok2:
		return "", false, false
	case f == "F" && g == "G":
		return "", false, true
	case f == g:
		return f, true, true
	}
	return "", false, false
}

// validTag is encoding/json's isValidTag: a tag's name with another
// character is no name, and the field is named by its Go name.
func validTag(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case !unicode.IsLetter(c) && !unicode.IsDigit(c):
			return false
		}
	}
	return true
}
