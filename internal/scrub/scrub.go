// Package scrub takes the credentials a request carried out of the text
// its answer brought back. A destination that quotes the request in its
// answer (an echo service; a 401 page "invalid token '…'"; a framework's
// debug page listing the headers) would otherwise put a credential the
// gateway sent into an error, a stored result, a log line or a span.
//
// A credential is taken out as it was sent, as its pieces (the token after
// an authentication scheme, the user:password inside Basic and its
// password) and in the encodings answers quote text in: JSON strings (with
// and without HTML escaping, with escaped slashes, ASCII-only), URL query
// and path escaping, HTML escaping. A credential the answer quotes cut
// short, or transformed otherwise, is not recognised.
package scrub

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"
)

// Mark is what each credential is replaced with.
const Mark = "[redacted]"

// MinPiece is the shortest piece of a credential (the token after its
// scheme, a Basic password) taken out on its own: shorter pieces would
// take ordinary words out of the text. A whole credential is taken out
// whatever its length.
const MinPiece = 4

// A Scrubber replaces credentials in text with Mark. A nil *Scrubber
// replaces nothing. It is safe for concurrent use.
type Scrubber struct {
	needles  []string // every form, longest first
	replacer *strings.Replacer
}

// New returns a Scrubber of credentials: values sent to a destination (a
// header's value, a password), each with its pieces and in its encodings.
// Empty values are ignored; nil when none is left.
func New(credentials ...string) *Scrubber { return (*Scrubber)(nil).With(credentials...) }

// With returns a Scrubber of s's credentials and these (New's rules).
func (s *Scrubber) With(credentials ...string) *Scrubber {
	var add []string
	for _, c := range credentials {
		for _, p := range pieces(c) {
			add = append(add, encodings(p)...)
		}
	}
	return s.plus(add)
}

// WithValues returns a Scrubber of s's credentials and of values (not
// split into pieces), each in its encodings; values shorter than min
// bytes are left alone. For values that are credentials only sometimes,
// such as a URL's query parameters.
func (s *Scrubber) WithValues(min int, values ...string) *Scrubber {
	var add []string
	for _, v := range values {
		if len(v) >= max(min, 1) {
			add = append(add, encodings(v)...)
		}
	}
	return s.plus(add)
}

func (s *Scrubber) plus(add []string) *Scrubber {
	if len(add) == 0 {
		return s
	}
	var needles []string
	if s != nil {
		needles = slices.Clone(s.needles)
	}
	for _, n := range add {
		if n != "" && !slices.Contains(needles, n) {
			needles = append(needles, n)
		}
	}
	if len(needles) == 0 {
		return nil
	}
	// The longest first: where two start at one place, the replacer takes
	// the one given first, so a credential's whole form wins over its
	// pieces.
	slices.SortFunc(needles, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	pairs := make([]string, 0, 2*len(needles))
	for _, n := range needles {
		pairs = append(pairs, n, Mark)
	}
	return &Scrubber{needles: needles, replacer: strings.NewReplacer(pairs...)}
}

// String is text with every credential replaced by Mark.
func (s *Scrubber) String(text string) string {
	if s == nil {
		return text
	}
	return s.replacer.Replace(text)
}

// Bytes is String for bytes (of any encoding: credentials are matched as
// bytes).
func (s *Scrubber) Bytes(b []byte) []byte {
	if s == nil {
		return b
	}
	return []byte(s.replacer.Replace(string(b)))
}

// Cut is b, a text cut off at its end (by a length limit, or a broken
// read), without the start of a credential it may end in: Bytes cannot
// recognise a credential whose rest was cut off. Call it before Bytes.
func (s *Scrubber) Cut(b []byte) []byte {
	if s == nil {
		return b
	}
	drop := 0
	for _, n := range s.needles {
		for k := min(len(n)-1, len(b)); k > drop; k-- {
			if string(b[len(b)-k:]) == n[:k] {
				drop = k
				break
			}
		}
	}
	return b[:len(b)-drop]
}

// Error is err with its text scrubbed; errors.Is and errors.As see err.
// err itself when its text holds no credential.
func (s *Scrubber) Error(err error) error {
	if err == nil || s == nil {
		return err
	}
	msg := err.Error()
	if clean := s.String(msg); clean != msg {
		return &scrubbed{msg: clean, err: err}
	}
	return err
}

type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// pieces are v and what of it an answer may quote alone: the credentials
// after an authentication scheme ("Bearer TOKEN": TOKEN), and for Basic
// the user:password they encode and the password.
func pieces(v string) []string {
	if v == "" {
		return nil
	}
	out := []string{v}
	add := func(p string) {
		if len(p) >= MinPiece {
			out = append(out, p)
		}
	}
	scheme, rest, ok := strings.Cut(strings.TrimLeft(v, " \t"), " ")
	if !ok || !isToken(scheme) {
		return out
	}
	cred := strings.Trim(rest, " \t")
	add(cred)
	if strings.EqualFold(scheme, "Basic") {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			dec, err := enc.DecodeString(cred)
			if err != nil || !utf8.Valid(dec) {
				continue
			}
			add(string(dec))
			if _, pass, ok := strings.Cut(string(dec), ":"); ok {
				add(pass)
			}
			break
		}
	}
	return out
}

// isToken reports whether s is an HTTP token (an authentication scheme's
// name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// encodings are p as answers quote it: as it is; inside a JSON string
// (Go's, with and without HTML escaping; with "\/" as PHP writes it;
// ASCII-only as Python writes it); URL query and path escaped; HTML
// escaped (Go's and the named-entity style).
func encodings(p string) []string {
	jsonHTML, jsonPlain := jsonInner(p, true), jsonInner(p, false)
	out := []string{p, jsonHTML, jsonPlain,
		strings.ReplaceAll(jsonHTML, "/", `\/`), strings.ReplaceAll(jsonPlain, "/", `\/`),
		asciiJSON(jsonPlain), strings.ReplaceAll(asciiJSON(jsonPlain), "/", `\/`),
		url.QueryEscape(p), url.PathEscape(p),
		html.EscapeString(p), strings.NewReplacer("&#34;", "&quot;", "&#39;", "&#x27;").Replace(html.EscapeString(p))}
	slices.Sort(out)
	return slices.Compact(out)
}

// jsonInner is p as a JSON string, without its quotes.
func jsonInner(p string, escapeHTML bool) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	if err := enc.Encode(p); err != nil {
		return p
	}
	s := strings.TrimSuffix(b.String(), "\n")
	return s[1 : len(s)-1]
}

// asciiJSON is a JSON string's inside with every non-ASCII character
// escaped (\u00e9; a surrogate pair above U+FFFF).
func asciiJSON(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < utf8.RuneSelf:
			b.WriteRune(r)
		case r > 0xFFFF:
			r -= 0x10000
			fmt.Fprintf(&b, `\u%04x\u%04x`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}
