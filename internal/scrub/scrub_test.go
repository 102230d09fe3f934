package scrub_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/scrub"
)

// Each credential is taken out whole, as its pieces and in each encoding
// an answer quotes it in; the text around it stays as it was.
func TestString(t *testing.T) {
	t.Parallel()
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("svc:pä/ss+w\"<&'d"))
	s := scrub.New("Bearer tok-123456", basic, "")
	cases := map[string]string{
		`auth "Bearer tok-123456" end`:                    `auth "[redacted]" end`,
		`invalid token 'tok-123456'`:                      `invalid token '[redacted]'`,
		"auth=Bearer+tok-123456&x=1":                      "auth=[redacted]&x=1",
		"/p/Bearer%20tok-123456":                          "/p/[redacted]",
		"svc:pä/ss+w\"<&'d and pä/ss+w\"<&'d":             "[redacted] and [redacted]",
		`{"p":"p\u00e4\/ss+w\"<&'d"}`:                     `{"p":"[redacted]"}`,
		`{"p":"pä/ss+w\"\u003c\u0026'd"}`:                 `{"p":"[redacted]"}`,
		"p&#228;/ss+w&#34;&lt;&amp;&#39;d":                "p&#228;/ss+w&#34;&lt;&amp;&#39;d", // numeric entities for letters: not recognised
		"pä/ss+w&quot;&lt;&amp;&#x27;d":                   "[redacted]",
		"p%C3%A4%2Fss%2Bw%22%3C%26%27d":                   "[redacted]",
		basic:                                             "[redacted]",
		strings.TrimPrefix(basic, "Basic ") + " and Bear": "[redacted] and Bear",
		"tok-12345 nothing":                               "tok-12345 nothing",
	}
	for in, want := range cases {
		if got := s.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
	var none *scrub.Scrubber
	if none.String("Bearer tok-123456") != "Bearer tok-123456" || scrub.New("", "") != nil {
		t.Error("a nil Scrubber changed text, or New of nothing is not nil")
	}
	// Values: whole, encoded, none shorter than min.
	v := scrub.New().WithValues(8, "QueryTok-1", "short")
	if got := v.String("x=QueryTok-1 y=short"); got != "x=[redacted] y=short" {
		t.Errorf("WithValues: %q", got)
	}
}

// Cut drops the start of a credential a text was cut off in, and nothing
// else.
func TestCut(t *testing.T) {
	t.Parallel()
	s := scrub.New("Bearer tok-123456")
	for in, want := range map[string]string{
		"body Bearer tok-12": "body ",
		"body tok-1":         "body ",
		"body done":          "body done",
		"Bearer tok-123456":  "Bearer tok-123456", // whole: Bytes takes it out
	} {
		if got := string(s.Cut([]byte(in))); got != want {
			t.Errorf("Cut(%q) = %q, want %q", in, got, want)
		}
	}
}
