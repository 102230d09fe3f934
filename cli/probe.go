package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
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
// with the error object on stdout and one line on stderr saying why; exit
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
		return a.fail(badInput("url", fmt.Sprintf("%q is not an http:// or https:// URL with a host", raw)))
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
	shown := u.Redacted()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return a.fail(badInput("url", err.Error()))
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
		return a.fail(unavailable(fmt.Sprintf("probe %s: %v", shown, err)))
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, probeBodyLimit+1))
	if err != nil && res.StatusCode/100 == 2 {
		// A 2xx whose body did not arrive whole within --timeout is a
		// process too slow to count as healthy.
		return a.fail(unavailable(fmt.Sprintf("probe %s: %d, then reading the body: %v", shown, res.StatusCode, err)))
	}
	if res.StatusCode/100 != 2 {
		msg := fmt.Sprintf("probe %s: %s", shown, res.Status)
		if loc := res.Header.Get("Location"); res.StatusCode/100 == 3 && loc != "" {
			msg += " to " + loc + " (not followed)"
		}
		if b := strings.TrimSpace(string(body)); b != "" {
			if len(b) > probeBodyLimit {
				b = b[:probeBodyLimit] + "…"
			}
			msg += ": " + b
		}
		return a.fail(unavailable(msg))
	}
	a.writeJSON(map[string]any{"url": shown, "status": res.StatusCode})
	return exitOK
}
