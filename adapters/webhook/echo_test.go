package webhook_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
	"github.com/fencegate/fencegate/outbox"
)

// The header secrets of the echo tests, and the distinctive piece of each
// that must never come back out of the adapter in any encoding: a bearer
// token, a Basic credential (base64 of user:password, its password with
// characters JSON, URLs and HTML escape), and a raw key with such
// characters itself.
var (
	partnerPassword = `pw/9+Xk2Lm7Qz&<q"`
	partnerBasic    = "Basic " + base64.StdEncoding.EncodeToString([]byte("svc-reports:"+partnerPassword))
	rawKey          = `kq/8+"Zr8Tq3Wn<&x`
	echoSecrets     = map[string]string{"billing-api": billingToken, "partner": partnerBasic, "raw-key": rawKey}
	// echoLeaks: what none of the adapter's outputs may contain.
	echoLeaks = []string{"7Qm2xR9vLk4pZt8w", strings.TrimPrefix(partnerBasic, "Basic "), "Xk2Lm7Qz", "Zr8Tq3Wn",
		"Vb6Np2Ws", // a legacy inline credential's value
		"Pp3Ld7Yc"} // a Location's query
	// queryToken is in the request URL's query: never in errors or logs.
	queryToken = "QueryTok-Hj5Kx9Rm"
)

// echoHeaders are the payload's headers: each secret by name, and an
// ordinary header that is echoed as it is.
func echoHeaders() map[string]any {
	return map[string]any{"Authorization": map[string]string{"secret": "billing-api"},
		"X-Partner-Auth": map[string]string{"secret": "partner"}, "X-Api-Key": map[string]string{"secret": "raw-key"}, "X-Tenant": "tenant-visible"}
}

// echo writes what receivers that quote the request write (httpbin, a
// 401 page "invalid token '…'", a PHP app's json_encode, a form echo, an
// HTML error page), in the form the path's last segment names; "all" is
// every form at once.
func echo(w io.Writer, r *http.Request, form string) {
	values := []string{}
	for _, name := range []string{"Authorization", "X-Partner-Auth", "X-Api-Key", "X-Legacy-Token"} {
		if v := r.Header.Get(name); v != "" {
			values = append(values, v)
		}
	}
	forms := map[string]func(){
		"json": func() {
			b, _ := json.Marshal(map[string]any{"headers": r.Header, "url": r.URL.String()})
			_, _ = w.Write(b)
		},
		"token": func() {
			for _, v := range values {
				_, cred, _ := strings.Cut(v, " ")
				_, _ = io.WriteString(w, "invalid token '"+cred+"' ")
			}
		},
		"form": func() {
			for _, v := range values {
				_, _ = io.WriteString(w, url.Values{"auth": {v}}.Encode()+"&path="+url.PathEscape(v)+" ")
			}
		},
		"php": func() {
			for _, v := range values {
				var b bytes.Buffer
				enc := json.NewEncoder(&b)
				enc.SetEscapeHTML(false)
				_ = enc.Encode(v)
				_, _ = io.WriteString(w, strings.ReplaceAll(strings.TrimSpace(b.String()), "/", `\/`)+" ")
			}
		},
		"basic": func() {
			for _, v := range values {
				if scheme, cred, ok := strings.Cut(v, " "); ok && scheme == "Basic" {
					dec, _ := base64.StdEncoding.DecodeString(cred)
					user, pass, _ := strings.Cut(string(dec), ":")
					_, _ = io.WriteString(w, "user "+user+" password '"+pass+"' refused; credentials "+string(dec))
				}
			}
		},
		"html": func() {
			for _, v := range values {
				_, _ = io.WriteString(w, "<p>Bad key &ldquo;"+html.EscapeString(v)+"&rdquo;</p>")
			}
		},
		"query": func() { _, _ = io.WriteString(w, "no route for "+r.URL.RequestURI()) },
	}
	if form == "all" {
		for _, name := range []string{"json", "token", "form", "php", "basic", "html", "query"} {
			forms[name]()
			_, _ = io.WriteString(w, "\n")
		}
		return
	}
	forms[form]()
}

// newEchoReceiver answers /STATUS/FORM with that status and the request
// echoed in that form; /200/binary answers bytes that are not UTF-8 (kept
// as base64) around the secret, /200/cut answers the secret across the
// result's 64 KiB limit. A 2xx carries a Location whose query is a
// credential and an X-Request-Id quoting the key; a 3xx a Location
// quoting the token in its path.
func newEchoReceiver(t *testing.T) *receiver {
	rc := newReceiver(t, nil)
	rc.respond = func(w http.ResponseWriter, r *http.Request, n int) {
		status, form, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		code, _ := strconv.Atoi(status)
		switch {
		case code >= 200 && code < 300:
			w.Header().Set("Location", "/orders/1?sig=LocSig-Pp3Ld7Yc")
			w.Header().Set("X-Request-Id", "req "+r.Header.Get("X-Api-Key"))
		case code >= 300 && code < 400:
			w.Header().Set("Location", "/next/"+url.PathEscape(r.Header.Get("Authorization"))+"?sig=LocSig-Pp3Ld7Yc")
		}
		w.WriteHeader(code)
		switch form {
		case "binary":
			_, _ = w.Write([]byte("\xff\xfe "))
			echo(w, r, "all")
		case "cut":
			// The token from its 21st byte on lies past the limit.
			_, _ = io.WriteString(w, strings.Repeat("x", webhook.MaxResultBody-20)+r.Header.Get("Authorization"))
		default:
			echo(w, r, form)
		}
	}
	return rc
}

// leaks returns the pieces of the secrets (and of the URL's query, when
// query) that text holds.
func leaks(text string, query bool) []string {
	var out []string
	for _, s := range echoLeaks {
		if strings.Contains(text, s) {
			out = append(out, s)
		}
	}
	if query && strings.Contains(text, "Hj5Kx9Rm") {
		out = append(out, "Hj5Kx9Rm")
	}
	return out
}

// resultText is a result as it is shown, with its base64 body decoded.
func resultText(t *testing.T, res json.RawMessage) string {
	t.Helper()
	var r webhook.Result
	if len(res) == 0 {
		return ""
	}
	if err := json.Unmarshal(res, &r); err != nil {
		t.Fatalf("result %s: %v", res, err)
	}
	dec, _ := base64.StdEncoding.DecodeString(r.BodyBase64)
	return string(res) + string(dec)
}

// A receiver that echoes the request (its headers, in any of the common
// encodings, its path and query) does not get a header secret's value
// into anything the adapter returns or logs: not an error's excerpt of the
// body (4xx, 5xx, 3xx, retryable or not, a lookup's), not a result's
// body (text or base64, cut at the limit or not) nor its headers
// (Location keeps no query, like an error's). A legacy inline credential
// is taken out the same way; the URL's query is out of errors and logs.
// Each value reached the receiver, and each echo is there with the
// values replaced.
func TestEchoedSecretsNotKept(t *testing.T) {
	t.Parallel()
	rc := newEchoReceiver(t)
	var logs toolbin.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}, HeaderSecrets: echoSecrets, Logger: logger})
	headers := echoHeaders()
	headers["X-Legacy-Token"] = "legacy-Vb6Np2Ws" // stored before inline credentials were refused
	forms := []string{"json", "token", "form", "php", "basic", "html", "query"}
	checked := 0
	check := func(what string, out adapters.Outcome, err error, wantResult bool) {
		t.Helper()
		checked++
		text := resultText(t, out.Result)
		if err != nil {
			text += err.Error()
		}
		if wantResult != (len(out.Result) > 0) {
			t.Errorf("%s: result %s, error %v", what, out.Result, err)
		}
		if l := leaks(text, err != nil); len(l) > 0 {
			t.Errorf("%s: the adapter's answer carries %q: result %s error %v", what, l, out.Result, err)
		}
	}
	for _, status := range []int{400, 403, 404, 500, 503, 501, 302, 301} {
		for _, form := range forms {
			key := adaptertest.UniqueKey(t)
			p := payload(rc.URL+"/"+strconv.Itoa(status)+"/"+form+"?token="+queryToken, map[string]any{"headers": headers})
			out, err := execute(t, a, request(key, p))
			check(strconv.Itoa(status)+" "+form, out, err, false)
			if err == nil {
				continue
			}
			if status == 400 && (form == "json" || form == "token") && !strings.Contains(err.Error(), "[redacted]") {
				t.Errorf("400 %s: %v, want the echo with the values replaced", form, err)
			}
		}
	}
	for _, form := range []string{"all", "binary", "cut"} {
		key := adaptertest.UniqueKey(t)
		out, err := execute(t, a, request(key, payload(rc.URL+"/200/"+form+"?token="+queryToken, map[string]any{"headers": headers})))
		check("200 "+form, out, err, true)
		if form == "cut" {
			var r webhook.Result
			_ = json.Unmarshal(out.Result, &r)
			if !r.Truncated || len(r.Body) > webhook.MaxResultBody || strings.Contains(r.Body, "7Qm2x") {
				t.Errorf("200 cut: truncated %v, %d bytes, ending %q: want it cut without the token's start", r.Truncated, len(r.Body), r.Body[max(0, len(r.Body)-40):])
			}
			continue
		}
		var r webhook.Result
		if err := json.Unmarshal(out.Result, &r); err != nil {
			t.Fatal(err)
		}
		if r.Headers["Location"] != "/orders/1" {
			t.Errorf("200 %s: Location %q, want /orders/1 (without its query)", form, r.Headers["Location"])
		}
		if form == "all" && (!strings.Contains(r.Body, "[redacted]") || !strings.Contains(r.Body, "tenant-visible") || !strings.Contains(r.Body, queryToken)) {
			t.Errorf("200 all: body %q, want the echo with the secrets replaced, the rest as it came", r.Body)
		}
		if got := rc.got(key); len(got) != 1 || got[0].Header.Get("Authorization") != billingToken ||
			got[0].Header.Get("X-Partner-Auth") != partnerBasic || got[0].Header.Get("X-Api-Key") != rawKey {
			t.Errorf("200 %s: the receiver did not get each secret's value once", form)
		}
	}
	// Lookups: a found answer (the result) and a refusal (the error).
	for _, tc := range []struct {
		path  string
		found bool
	}{{"/200/all", true}, {"/403/json", false}, {"/500/token", false}, {"/404/json", false}} {
		p := payload(rc.URL+"/200/json", map[string]any{"headers": headers, "lookup_url": rc.URL + tc.path + "?token=" + queryToken})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, found, err := a.Lookup(ctx, request(adaptertest.UniqueKey(t), p))
		cancel()
		if found != tc.found {
			t.Errorf("lookup %s: found %v, %v", tc.path, found, err)
		}
		check("lookup "+tc.path, out, err, tc.found)
	}
	t.Logf("checked %d answers", checked)
	if checked == 0 {
		t.Fatal("no answer checked")
	}
	if l := leaks(logs.String(), true); len(l) > 0 {
		t.Errorf("the logs carry %q: %s", l, logs.String())
	}
}

// The same through the runtime, where the texts are kept: an echoing
// receiver's 400 (failed), 500 (unknown, held) and 200 (succeeded) leave
// no secret in the stored intent (last_error, result), its attempt
// history, or the runtime's log lines; the 200's result keeps the echo
// with the values replaced.
func TestRuntimeEchoedSecretNotStored(t *testing.T) {
	t.Parallel()
	rc := newEchoReceiver(t)
	var logs toolbin.SyncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}, HeaderSecrets: echoSecrets, Logger: logger})
	e := adaptertest.NewEnv(t, adaptertest.Options{Executors: []adapters.Executor{a}, Kinds: map[string]outbox.KindSpec{webhook.Kind: a.KindSpec()},
		Runtime: executor.Config{Logger: logger, Unknown: executor.UnknownHold}})
	ids := map[int64]outbox.Status{}
	for path, want := range map[string]outbox.Status{"/400/json": outbox.StatusFailed, "/500/token": outbox.StatusUnknown, "/200/all": outbox.StatusSucceeded} {
		key := adaptertest.UniqueKey(t)
		id := enqueue(t, e, key, payload(rc.URL+path+"?token="+queryToken, map[string]any{"headers": echoHeaders()}))
		rec := e.WaitStatus(t, id, want)
		ids[id] = want
		stored, _ := json.Marshal(rec)
		if l := leaks(string(stored)+resultText(t, rec.Result), false); len(l) > 0 {
			t.Errorf("%s: the stored intent carries %q: %s", path, l, stored)
		}
		// The payload holds the URL's query (the operator's view), an
		// error never.
		if l := leaks(deref(rec.LastError), true); len(l) > 0 {
			t.Errorf("%s: last_error carries %q: %s", path, l, deref(rec.LastError))
		}
		if want != outbox.StatusSucceeded && (rec.LastError == nil || !strings.Contains(*rec.LastError, "[redacted]")) {
			t.Errorf("%s: last_error %s, want the echo with the values replaced", path, deref(rec.LastError))
		}
	}
	n := 0
	for id := range ids {
		rows, err := e.Pool.Query(context.Background(), adaptertest.SQL("SELECT row_to_json(a)::text FROM fencegate.intent_attempts a WHERE intent_id = $1"), id)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var row string
			if err := rows.Scan(&row); err != nil {
				t.Fatal(err)
			}
			n++
			if l := leaks(row, ids[id] != outbox.StatusSucceeded); len(l) > 0 {
				t.Errorf("attempt %s carries %q", row, l)
			}
		}
		rows.Close()
	}
	t.Logf("checked %d intents, %d attempts", len(ids), n)
	if n < len(ids) {
		t.Fatalf("%d attempts recorded for %d intents", n, len(ids))
	}
	if !strings.Contains(logs.String(), "[redacted]") {
		t.Errorf("no log line quotes an echo: the log check checks nothing: %s", logs.String())
	}
	if l := leaks(logs.String(), true); len(l) > 0 {
		t.Errorf("the logs carry %q", l)
	}
}
