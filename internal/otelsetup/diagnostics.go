package otelsetup

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
)

// diagnosticsOnce installs the diagnostics once per process: the first
// otel.SetErrorHandler is the one the handlers already handed out forward
// to.
var diagnosticsOnce sync.Once

// installDiagnostics makes OpenTelemetry's own logger and error handler
// write one line each to w, "gateway: opentelemetry: …", without the
// values they carry. Their defaults printed them whole: an OTLP endpoint
// that does not parse ("parse url" "input"="http://user:<password>%zz@…"),
// a header value that cannot be unescaped (an Authorization header's
// token). The message and the names of the values are kept, so the line
// still says what is wrong and where; a URL in an error is shown without
// its user info and query, and not at all when it does not parse.
//
// Like OpenTelemetry's default logger it prints errors and level 0
// messages only (Warn is V(1), Info V(4), Debug V(8)).
func installDiagnostics(w io.Writer) {
	diagnosticsOnce.Do(func() {
		out := &diagnostics{w: w}
		otel.SetLogger(logr.New(out))
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { out.Error(err, "") }))
	})
}

// diagnostics is a logr.LogSink writing safe lines to w.
type diagnostics struct {
	w    io.Writer
	name string
}

// writeMu keeps the lines whole.
var writeMu sync.Mutex

var _ logr.LogSink = (*diagnostics)(nil)

// shownKeys are the values printed as they are: file paths, never a
// secret.
var shownKeys = map[string]bool{"file": true}

func (d *diagnostics) Init(logr.RuntimeInfo) {}

func (d *diagnostics) Enabled(level int) bool { return level <= 0 }

func (d *diagnostics) Info(_ int, msg string, kv ...any) { d.write(msg, nil, kv) }

func (d *diagnostics) Error(err error, msg string, kv ...any) { d.write(msg, err, kv) }

func (d *diagnostics) WithValues(...any) logr.LogSink { return d }

func (d *diagnostics) WithName(name string) logr.LogSink {
	c := *d
	c.name = strings.TrimPrefix(d.name+"/"+name, "/")
	return &c
}

func (d *diagnostics) write(msg string, err error, kv []any) {
	var b strings.Builder
	b.WriteString("gateway: opentelemetry: ")
	if d.name != "" {
		b.WriteString(d.name + ": ")
	}
	b.WriteString(msg)
	if err != nil {
		if msg != "" {
			b.WriteString(": ")
		}
		b.WriteString(safeError(err))
	}
	var hidden []string
	for i := 0; i+1 < len(kv); i += 2 {
		k := fmt.Sprint(kv[i])
		if shownKeys[k] {
			fmt.Fprintf(&b, " %s=%q", k, fmt.Sprint(kv[i+1]))
		} else {
			hidden = append(hidden, k)
		}
	}
	if len(hidden) > 0 {
		fmt.Fprintf(&b, " (%s not shown: it may hold a password)", strings.Join(hidden, ", "))
	}
	writeMu.Lock()
	defer writeMu.Unlock()
	_, _ = io.WriteString(d.w, oneLine(b.String())+"\n")
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// safeError is err's text with what it quotes of a URL taken out: a
// *url.Error's URL (the whole value, when it did not parse; else without
// user info and query), an *url.EscapeError's bytes (a piece of a
// password or header value).
func safeError(err error) string {
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		shown := "the URL does not parse"
		if ue.Op != "parse" {
			shown = ue.Op + " " + safeURL(ue.URL) + ": " + safeError(ue.Err)
		}
		msg = strings.ReplaceAll(msg, ue.Error(), shown)
	}
	var ee url.EscapeError
	if errors.As(err, &ee) {
		msg = strings.ReplaceAll(msg, ee.Error(), "invalid URL escape")
	}
	var he url.InvalidHostError
	if errors.As(err, &he) {
		msg = strings.ReplaceAll(msg, he.Error(), "invalid character in host name")
	}
	return msg
}

// safeURL is raw, quoted, without its user info, query and fragment;
// not shown when it does not parse.
func safeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a URL, not shown)"
	}
	cut := u.RawQuery != "" || u.ForceQuery || u.Fragment != ""
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	if cut {
		return fmt.Sprintf("%q", u.String()+"?…")
	}
	return fmt.Sprintf("%q", u.String())
}
