package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/fencegate/fencegate/internal/scrub"
)

// defaultProbeTimeout bounds the whole request: a /readyz answer takes at
// most about 2 s per check that leaves the process (postgres, stream), so
// 5 s lets a slow but working process pass while a hung one fails.
const defaultProbeTimeout = 5 * time.Second

// probeBodyLimit is how much of a failing answer's body the one-line
// message quotes: enough for /readyz's checks, which name what is down.
const probeBodyLimit = 300

// cmdProbe is `gateway probe URL`: one GET of URL, for container
// healthchecks in an image with no shell, curl or wget (distroless). Exit
// 0 on a 2xx answer, with {"url","status"} on stdout; exit 1 on anything
// else — no answer within --timeout, a refused connection, a non-2xx
// status, a redirect (not followed: the probe checks the URL it is given) —
// with the error object on stdout (with "url" and "status" when an answer
// came) and one line on stderr saying why; every URL printed is redacted
// (redactURL), a URL refused is never echoed as given, and a body quoted
// has the credentials the probe sent taken out (probeScrubber); exit
// 2 on a bad URL or flag. https URLs are verified against the system's
// roots, or against --tls-ca (e.g. the admin server's own --tls-cert).
// It reads no environment and connects to nothing but URL.
func cmdProbe(ctx context.Context, a *app, args []string) int {
	fs := flag.NewFlagSet("gateway probe", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	timeout := fs.Duration("timeout", defaultProbeTimeout, "give up after this long (connection, answer and body)")
	tlsCA := fs.String("tls-ca", "", "CA certificates (PEM) to verify an https URL with (default: the system's); the server's own self-signed certificate works")
	// Flags may come before or after the URL (gateway probe URL --timeout 2s).
	if code, ok := a.parse(fs, args); !ok {
		return code
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return a.fail(badInput("url", "gateway probe needs a URL, e.g. gateway probe http://127.0.0.1:9090/healthz"))
	}
	raw := rest[0]
	if code, ok := a.parseOnly(fs, rest[1:]); !ok {
		return code
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// Never the text as given: a URL that does not parse may have
		// split its password anywhere (a '/' in it ends the host), and
		// the parser's error quotes it. One that parses is shown
		// redacted.
		what := "the URL"
		if err == nil && u.Host != "" {
			what = redactURL(raw)
		}
		return a.fail(badInput("url", what+" is not an http:// or https:// URL with a host, e.g. http://127.0.0.1:9090/healthz"))
	}
	if *timeout <= 0 {
		return a.fail(badInput("timeout", "--timeout must be positive, a duration such as 2s"))
	}
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true, TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}}
	if *tlsCA != "" {
		pem, err := os.ReadFile(*tlsCA)
		if err != nil {
			return a.fail(badInput("tls_ca", "--tls-ca: "+err.Error()))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return a.fail(badInput("tls_ca", "--tls-ca "+*tlsCA+" holds no PEM certificate"))
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	client := &http.Client{
		Transport: tr,
		Timeout:   *timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	// Every URL printed, in the result and in errors, is shown without its
	// password and ?password=-style parameters (docs/operations.md).
	shown := redactURL(raw)
	sc := probeScrubber(u)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its text is the whole URL
		}
		return a.fail(badInput("url", fmt.Sprintf("probe %s: %v", shown, err)))
	}
	req.Header.Set("User-Agent", "fencegate-probe")
	res, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is said once, below
		}
		if errors.Is(err, context.DeadlineExceeded) || (ue != nil && ue.Timeout()) {
			return a.fail(unavailable(fmt.Sprintf("probe %s: no answer within %s", shown, *timeout)))
		}
		return a.fail(unavailable(fmt.Sprintf("probe %s: %s", shown, sc.String(err.Error()))))
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, probeBodyLimit+1))
	if len(body) > probeBodyLimit || err != nil {
		body = sc.Cut(body) // a credential's start, its rest not read
	}
	// An answer may quote the request (an echo service, a "bad
	// credentials" page): without what the probe sent that is hidden.
	body = sc.Bytes(body)
	// An answer that is not healthy still says, as the success object
	// does, which URL answered and its status: a reader of the JSON tells
	// a 503 from no answer.
	answered := func(msg string) int {
		e := unavailable(msg)
		e.Extra = map[string]any{"url": shown, "status": res.StatusCode}
		return a.fail(e)
	}
	if err != nil && res.StatusCode/100 == 2 {
		// A 2xx whose body did not arrive whole within --timeout is a
		// process too slow to count as healthy.
		return answered(fmt.Sprintf("probe %s: %d, then reading the body: %v", shown, res.StatusCode, err))
	}
	if res.StatusCode/100 != 2 {
		msg := fmt.Sprintf("probe %s: %s", shown, res.Status)
		redirect := res.StatusCode/100 == 3
		if loc := res.Header.Get("Location"); redirect && loc != "" {
			msg += " to " + redactLocation(loc) + " (not followed)"
		}
		// A redirect's body repeats its Location (net/http's <a href>),
		// credentials and all: the Location, redacted, says it.
		if b := strings.TrimSpace(string(body)); b != "" && !redirect {
			if len(b) > probeBodyLimit {
				b = b[:probeBodyLimit] + "…"
			}
			msg += ": " + b
		}
		return answered(msg)
	}
	a.writeJSON(map[string]any{"url": shown, "status": res.StatusCode})
	return exitOK
}

// probeScrubber takes out of an answer what the probe sent that it never
// shows: the URL's password, as given and in the Authorization: Basic
// header Go's client makes of the userinfo, and the values of the query's
// secret parameters (secretParam) and of pairs that do not parse (neither
// is shown in the redacted URL).
func probeScrubber(u *url.URL) *scrub.Scrubber {
	var sc *scrub.Scrubber
	if u.User != nil {
		pass, _ := u.User.Password()
		sc = scrub.New("Basic "+base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pass)), pass)
	}
	for _, pair := range strings.Split(u.RawQuery, "&") {
		k, v, _ := strings.Cut(pair, "=")
		name, kerr := url.QueryUnescape(k)
		dec, verr := url.QueryUnescape(v)
		if kerr != nil || verr != nil || secretParam(name) {
			sc = sc.WithValues(1, v, dec)
		}
	}
	return sc
}
