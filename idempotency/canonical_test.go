package idempotency

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// canonicalSeeds are payloads at the edges of the fast path: each is
// checked against the reference path by TestCanonicalMatchesReference and
// seeds FuzzCanonicalMatchesReference.
var canonicalSeeds = []string{
	`{}`, `[]`, `null`, `true`, `false`, `0`, `-0`, `1.5e+10`, `1E-2`, `""`,
	` {"b":1, "a" : [1, 2.50, {"d":null,"c":true}] } `,
	`{"a":1,"a":2}`, `{"b":{"x":1},"a":{"y":2},"b":{"z":3}}`,
	`{"to":["a@example.com"],"from":"r@example.com","subject":"Nightly","text":"Hello,\nthe report.\n","headers":{"X-Job":"nightly"}}`,
	`"tab\there \"quoted\" back\\slash \/ \b \f \r"`,
	`"<html> & ünïcödé 日本語 😀"`, `{"ü":1,"a":2,"Z":3,"日":4}`,
	`"\u0041"`, `{"\u0061":1}`, `"\ud83d\ude00"`, `"\ud800"`, `"line\u2028sep"`,
	"\"raw\u2028sep\"", "\"raw\x01control\"", "\"bad\xffutf8\"", "{\"k\xff\":1}",
	`01`, `1.`, `.5`, `-`, `1e`, `+1`, `tru`, `nul`, `{"a":1,}`, `[1,]`, `{"a"}`,
	`{"a":1}{}`, `{"a":1} x`, `[1 2]`, `{a:1}`, `"unterminated`, `"\x"`, `"\`, ``, `   `,
	"\ufeff{}", strings.Repeat("[", 70) + strings.Repeat("]", 70),
	strings.Repeat(`{"a":`, 7) + "1" + strings.Repeat("}", 7),
	strings.Repeat(`{"a":`, 8) + "1" + strings.Repeat("}", 8),
	strings.Repeat(`{"a":`, 9) + "1" + strings.Repeat("}", 9),
	strings.Repeat(`[{"b":2,"a":`, 8) + "1" + strings.Repeat("}]", 8),
}

// checkCanonical compares the fast path's answer for in with the
// reference's: where the fast path answers, it must answer as the
// reference does; and validJSON must answer as json.Valid. It reports
// whether the fast path answered.
func checkCanonical(t testing.TB, in []byte) bool {
	t.Helper()
	if got, want := validJSON(in), json.Valid(in); got != want {
		t.Fatalf("validJSON(%q) = %v, json.Valid says %v", in, got, want)
	}
	c := getCanonicalizer()
	defer c.release()
	got, ok := c.fast(in)
	if !ok {
		return false
	}
	want, refOK := canonicalJSON(in)
	if !refOK {
		t.Fatalf("fast path accepted %q, which the reference refuses", in)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("canonical form of %q:\n fast      %q\n reference %q", in, got, want)
	}
	return true
}

// The fast path writes exactly the reference's bytes, or leaves the
// payload to it, and validJSON answers as json.Valid: on the seeds, on random JSON documents (keys out of order
// and repeated, strings with escapes and non-ASCII text, numbers of every
// form, white space between tokens), and on those documents with one byte
// changed, which must not be accepted where the reference refuses them.
// It fails when the fast path answered for too few of them to mean
// anything.
func TestCanonicalMatchesReference(t *testing.T) {
	t.Parallel()
	fast, total := 0, 0
	for _, s := range canonicalSeeds {
		total++
		if checkCanonical(t, []byte(s)) {
			fast++
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	const docs = 5000
	generated := 0
	for range docs {
		var b strings.Builder
		randomJSON(r, &b, 0)
		doc := []byte(b.String())
		total++
		if checkCanonical(t, doc) {
			fast++
			generated++
		}
		for range 3 {
			m := bytes.Clone(doc)
			m[r.IntN(len(m))] = "{}[],:\"\\ 0aé\x00"[r.IntN(14)]
			total++
			if checkCanonical(t, m) {
				fast++
			}
		}
	}
	t.Logf("%d payloads checked, %d answered by the fast path (%d of %d generated documents)", total, fast, generated, docs)
	if generated < docs/2 {
		t.Fatalf("the fast path answered only %d of %d generated documents: the comparison checked too little", generated, docs)
	}
}

// randomJSON writes a random JSON value, with random white space.
func randomJSON(r *rand.Rand, b *strings.Builder, depth int) {
	ws := func() {
		if r.IntN(4) == 0 {
			b.WriteString([]string{" ", "\n", "\t ", "\r\n  "}[r.IntN(4)])
		}
	}
	ws()
	kind := r.IntN(8)
	if depth > 4 {
		kind = 2 + r.IntN(6)
	}
	switch kind {
	case 0, 1:
		b.WriteByte('{')
		keys := []string{"a", "b", "B", "aa", "to", "ü", "日本", "a b", "<&>", "z"}
		for i, n := 0, r.IntN(6); i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			ws()
			fmt.Fprintf(b, "%q", keys[r.IntN(len(keys))])
			ws()
			b.WriteByte(':')
			randomJSON(r, b, depth+1)
		}
		ws()
		b.WriteByte('}')
	case 2:
		b.WriteByte('[')
		for i, n := 0, r.IntN(5); i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			randomJSON(r, b, depth+1)
		}
		ws()
		b.WriteByte(']')
	case 3, 4:
		b.WriteByte('"')
		parts := []string{"plain", " ", "\\n", "\\t", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\r", "é", "日本語", "😀", "<>&", "\x7f"}
		if r.IntN(10) == 0 {
			parts = append(parts, "\\u00e9", "\\u2028", "\u2028", "\\ud83d\\ude00")
		}
		for i, n := 0, r.IntN(6); i < n; i++ {
			b.WriteString(parts[r.IntN(len(parts))])
		}
		b.WriteByte('"')
	case 5:
		b.WriteString([]string{"0", "-0", "12", "-3.25", "1e9", "2E-7", "6.02e+23", "123456789012345678901234567890", "0.10"}[r.IntN(9)])
	default:
		b.WriteString([]string{"true", "false", "null"}[r.IntN(3)])
	}
	ws()
}

func FuzzCanonicalMatchesReference(f *testing.F) {
	for _, s := range canonicalSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) { checkCanonical(t, in) })
}

// Fingerprints are stored with keys: a payload's must not change between
// versions, or an intent retried after an upgrade would conflict with its
// own key. These were computed by the version before the fast path
// (8de3c57, encoding/json alone); the first goes to the reference path
// (a \u escape), the second and third to the fast one.
func TestFingerprintUnchangedSinceEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ kind, payload, want string }{
		{"email", "{\"to\":[\"a@example.com\"],\"from\":\"r@example.com\",\"subject\":\"Nightly \\u00e9\",\"text\":\"Hello,\\nthe report.\\n\",\"headers\":{\"X-Job\":\"nightly\"}}", "c09626cb0719b661d773da4459122731f44ccf943233596d39b12207d272027d"},
		{"file", " {\"path\":\"reports/2026-12-04.csv\", \"content\":\"a,b\\n1,2\\n\", \"b\":[1, 2.50, {\"d\":null,\"c\":true}], \"a\":1, \"a\":2} ", "07c2bf640933222a1dd7910b5fe38a39b3597303bf0e71fca7286d2e04fe21b4"},
		{"webhook", "{\"url\":\"https://example.com/hook?x=1&y=<2>\",\"body\":{\"日本\":\"語\",\"z\":\"\\/path\",\"emoji\":\"😀\"}}", "361db5549aadf96af1f345cc84a8d48d412faddb25fb6d2b4c8a8a5322450ea3"},
		{"email", "not json", "a2f4372217122b6661cb98e045e4780ef02046f02c1637d0d8accb9de82bd9bd"},
	} {
		if got := Fingerprint(c.kind, []byte(c.payload)); got != c.want {
			t.Errorf("Fingerprint(%q, %s) = %s; want %s, as before", c.kind, c.payload, got, c.want)
		}
	}
	c := getCanonicalizer()
	defer c.release()
	if _, ok := c.fast([]byte("{\"url\":\"https://example.com/hook?x=1&y=<2>\",\"body\":{\"日本\":\"語\",\"z\":\"\\/path\",\"emoji\":\"😀\"}}")); !ok {
		t.Error("the webhook payload did not take the fast path: the test checks less than it says")
	}
}

// BenchmarkFingerprint measures Fingerprint of a small email payload next
// to the same fingerprint by the reference path alone (encoding/json's
// decode and encode, as every payload was canonicalised before the fast
// path), alternately in the same run: "x-reference" is the first's time
// as a share of the second's.
func BenchmarkFingerprint(b *testing.B) {
	payload := []byte(`{"to":["ops@example.com","cfo@example.com"],"from":"reports@example.com","subject":"Nightly report 2026-12-04",` +
		`"text":"Hello,\nthe nightly report is attached.\n\n-- \nfencegate","headers":{"X-Job":"nightly","X-Run":"42"}}`)
	reference := func() string {
		canon, isJSON := canonicalJSON(payload)
		return fingerprint("email", payload, canon, isJSON)
	}
	if Fingerprint("email", payload) != reference() {
		b.Fatal("the two paths disagree")
	}
	var fast, ref time.Duration
	for b.Loop() {
		start := time.Now()
		Fingerprint("email", payload)
		mid := time.Now()
		reference()
		fast += mid.Sub(start)
		ref += time.Since(mid)
	}
	b.ReportMetric(float64(fast.Nanoseconds())/float64(b.N), "ns/fingerprint")
	b.ReportMetric(float64(ref.Nanoseconds())/float64(b.N), "ns/reference")
	b.ReportMetric(float64(fast)/float64(ref), "x-reference")
}
