package idempotency

import (
	"bytes"
	"encoding/json"
	"slices"
	"sync"
	"unicode/utf8"
)

// The canonical form is defined by canonicalJSON's reference path:
// encoding/json decodes the payload (UseNumber) and re-encodes it (sorted
// object keys, no insignificant white space, SetEscapeHTML(false)). That
// path allocates a value for every node (about 60 allocations and 10-20 µs
// for a small email payload, most of the executor's own CPU per intent).
// The fast path (canonicalizer.fast) writes the same bytes from the
// payload itself, for the payloads workers send: strings of printable ASCII or valid UTF-8, with
// the one-character escapes (\" \\ \/ \b \f \n \r \t), object keys without
// escapes, nesting up to fastMaxDepth. Anything else — a \u escape, a
// control character, invalid UTF-8, U+2028/U+2029 (which the encoder
// escapes), a key with an escape, invalid JSON — makes it answer ok=false,
// and the reference path decides, so the fingerprint of every payload is
// the reference's: a fingerprint stored by an older version must match the
// same payload's fingerprint now, or a retried intent would conflict with
// its own key. FuzzCanonicalMatchesReference holds the two paths equal.

// fastMaxDepth bounds the fast path's nesting; deeper payloads go to the
// reference. An object's members are read twice (checked and found, then
// written in key order), so a value is read once more for every object
// around it: at 8 levels a 256 KiB payload's worst case costs about what
// the reference does (a string of 250 KiB under 63 objects took 3.5× the
// reference's time; under 7 or 8, 0.9–1.7× on a busy machine, 1.9–2.8 ms).
const fastMaxDepth = 8

type canonicalizer struct {
	in  []byte
	pos int
	// out is the canonical form being written (kept for the next
	// payload).
	out []byte
	// members is a stack of the members of the objects being written.
	members []member
}

// member is one object member: its key (the raw bytes between the quotes,
// which without escapes are the decoded key) and where its value starts in
// the payload.
type member struct {
	key   []byte
	value int
	seq   int
}

var canonicalizers = sync.Pool{New: func() any { return new(canonicalizer) }}

// maxPooledBuf is the largest output buffer kept for the next payload.
const maxPooledBuf = 64 << 10

// canonical returns payload's canonical form and true, or false when
// payload is not one JSON value. The bytes are valid until release.
func (c *canonicalizer) canonical(payload []byte) ([]byte, bool) {
	if out, ok := c.fast(payload); ok {
		return out, true
	}
	return canonicalJSON(payload)
}

func getCanonicalizer() *canonicalizer { return canonicalizers.Get().(*canonicalizer) }

func (c *canonicalizer) release() {
	// The members' keys point into the payload: cleared, so that a pooled
	// canonicalizer does not keep a payload alive.
	clear(c.members[:cap(c.members)])
	c.in, c.members = nil, c.members[:0]
	if cap(c.out) > maxPooledBuf {
		c.out = nil
	}
	canonicalizers.Put(c)
}

// fast returns payload's canonical form by the fast path, or false when
// the payload is outside what it handles (see above): then the reference
// path must decide.
func (c *canonicalizer) fast(payload []byte) ([]byte, bool) {
	c.out = c.out[:0]
	if !c.scan(payload, true) {
		return nil, false
	}
	return c.out, true
}

// validJSON reports whether b is one JSON value, as json.Valid does: the
// fast path's check where it answers, json.Valid where it does not. (The
// executor checks every outcome's result: json.Valid's decoder state grew
// the stack of each handler's goroutine, ~10 µs an outcome.)
func validJSON(b []byte) bool {
	c := getCanonicalizer()
	defer c.release()
	return c.scan(b, false) || json.Valid(b)
}

// scan reads in as one JSON value with white space around it, writing its
// canonical form to c.out when write is set; false when the fast path
// does not handle it (trailing data included: the reference refuses it).
func (c *canonicalizer) scan(in []byte, write bool) bool {
	c.in, c.pos = in, 0
	c.skipSpace()
	if !c.value(0, write) {
		return false
	}
	c.skipSpace()
	return c.pos == len(c.in)
}

func (c *canonicalizer) skipSpace() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// value reads one JSON value at c.pos, checking it, and writes its
// canonical form to c.out when write is set.
func (c *canonicalizer) value(depth int, write bool) bool {
	if c.pos >= len(c.in) {
		return false
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return depth < fastMaxDepth && c.object(depth+1, write)
	case b == '[':
		return depth < fastMaxDepth && c.array(depth+1, write)
	case b == '"':
		return c.str(write)
	case b == '-' || b >= '0' && b <= '9':
		return c.number(write)
	default:
		lit := ""
		switch b {
		case 't':
			lit = "true"
		case 'f':
			lit = "false"
		case 'n':
			lit = "null"
		}
		if lit == "" || !bytes.HasPrefix(c.in[c.pos:], []byte(lit)) {
			return false
		}
		c.pos += len(lit)
		if write {
			c.out = append(c.out, lit...)
		}
		return true
	}
}

// put appends b to c.out when writing.
func (c *canonicalizer) put(write bool, b ...byte) {
	if write {
		c.out = append(c.out, b...)
	}
}

func (c *canonicalizer) array(depth int, write bool) bool {
	c.pos++ // '['
	c.put(write, '[')
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		c.put(write, ']')
		return true
	}
	for {
		c.skipSpace()
		if !c.value(depth, write) {
			return false
		}
		c.skipSpace()
		if c.pos >= len(c.in) {
			return false
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
			c.put(write, ',')
		case ']':
			c.pos++
			c.put(write, ']')
			return true
		default:
			return false
		}
	}
}

// object reads an object's members, checking their values, and, when
// writing, writes them sorted by key (byte order, as encoding/json sorts a
// map's keys), the last of duplicate keys kept (as a map, and jsonb, keep
// it): each kept member's value is read again from where it starts, this
// time written.
func (c *canonicalizer) object(depth int, write bool) bool {
	c.pos++ // '{'
	base := len(c.members)
	defer func() { c.members = c.members[:base] }()
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		c.put(write, '{', '}')
		return true
	}
	for seq := 0; ; seq++ {
		c.skipSpace()
		key, ok := c.key()
		if !ok {
			return false
		}
		c.skipSpace()
		if c.pos >= len(c.in) || c.in[c.pos] != ':' {
			return false
		}
		c.pos++
		c.skipSpace()
		if write {
			c.members = append(c.members, member{key: key, value: c.pos, seq: seq})
		}
		if !c.value(depth, false) {
			return false
		}
		c.skipSpace()
		if c.pos >= len(c.in) {
			return false
		}
		if c.in[c.pos] == '}' {
			c.pos++
			break
		}
		if c.in[c.pos] != ',' {
			return false
		}
		c.pos++
	}
	if !write {
		return true
	}
	end := c.pos
	// Nested objects push their members above this object's and pop them
	// again; ms keeps this object's, even when c.members grows elsewhere.
	ms := c.members[base:]
	slices.SortFunc(ms, func(a, b member) int {
		if k := bytes.Compare(a.key, b.key); k != 0 {
			return k
		}
		return a.seq - b.seq
	})
	c.out = append(c.out, '{')
	first := true
	for i, m := range ms {
		if i+1 < len(ms) && bytes.Equal(ms[i+1].key, m.key) {
			continue // a later member of the same key wins
		}
		if !first {
			c.out = append(c.out, ',')
		}
		first = false
		c.out = append(c.out, '"')
		c.out = append(c.out, m.key...)
		c.out = append(c.out, '"', ':')
		c.pos = m.value
		if !c.value(depth, true) {
			return false // checked above; cannot happen
		}
	}
	c.out = append(c.out, '}')
	c.pos = end
	return true
}

// key reads an object key that needs no decoding (no escape), which is
// then written as it stands.
func (c *canonicalizer) key() ([]byte, bool) {
	if c.pos >= len(c.in) || c.in[c.pos] != '"' {
		return nil, false
	}
	start := c.pos + 1
	end, ok := plainString(c.in, start)
	if !ok || end >= len(c.in) || c.in[end] != '"' {
		return nil, false
	}
	c.pos = end + 1
	return c.in[start:end], true
}

// plainString returns where the run of characters from i that are written
// as they stand ends: printable ASCII but '"' and '\\', and valid UTF-8
// but U+2028 and U+2029. ok is false at a character the fast path does not
// handle (a control character, invalid UTF-8, U+2028/U+2029).
func plainString(in []byte, i int) (int, bool) {
	for i < len(in) {
		b := in[i]
		if b < utf8.RuneSelf {
			if b < 0x20 {
				return i, false
			}
			if b == '"' || b == '\\' {
				return i, true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(in[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			return i, false
		}
		i += size
	}
	return i, true
}

// str writes a string value, re-escaped as encoding/json escapes it.
func (c *canonicalizer) str(write bool) bool {
	c.pos++ // '"'
	c.put(write, '"')
	for {
		end, ok := plainString(c.in, c.pos)
		if !ok || end >= len(c.in) {
			return false
		}
		c.put(write, c.in[c.pos:end]...)
		c.pos = end
		if c.in[c.pos] == '"' {
			c.pos++
			c.put(write, '"')
			return true
		}
		// A backslash: the one-character escapes, written back as the
		// encoder writes the character they stand for ("\/" is "/").
		if c.pos+1 >= len(c.in) {
			return false
		}
		switch e := c.in[c.pos+1]; e {
		case '"', '\\', 'b', 'f', 'n', 'r', 't':
			c.put(write, '\\', e)
		case '/':
			c.put(write, '/')
		default:
			return false // \u escapes and invalid ones: the reference decides
		}
		c.pos += 2
	}
}

// number copies a number literal (the reference keeps numbers as written,
// UseNumber) after checking JSON's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (c *canonicalizer) number(write bool) bool {
	in, i := c.in, c.pos
	digits := func() bool {
		s := i
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
		return i > s
	}
	if i < len(in) && in[i] == '-' {
		i++
	}
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(in) && in[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	c.put(write, in[c.pos:i]...)
	c.pos = i
	return true
}
