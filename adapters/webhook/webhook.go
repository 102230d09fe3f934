package webhook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/scrub"
	"github.com/fencegate/fencegate/kinds/webhookkind"
	"github.com/fencegate/fencegate/outbox"
)

// Kind is the intent kind the adapter executes.
const Kind = webhookkind.Name

// Defaults.
const (
	// DefaultMaxConcurrencyPerHost is Config.MaxConcurrencyPerHost's
	// default.
	DefaultMaxConcurrencyPerHost = 8
	// MaxResultBody is the most of a response body kept in the result:
	// 64 KiB, the rest cut off and the result marked truncated.
	MaxResultBody = 64 << 10
)

// Errors, matched with errors.Is; each is permanent (the request was not
// sent and never will be).
var (
	// ErrNotAllowed: the URL's host is not in Config.Allow.
	ErrNotAllowed = errors.New("webhook: destination not allowed")
	// ErrInternalAddress: the host resolved to a loopback, private,
	// link-local or otherwise internal address that is not itself in
	// Config.Allow (no SSRF through DNS).
	ErrInternalAddress = errors.New("webhook: destination resolves to an internal address that is not allowed")
	// ErrBadPayload: the payload is not a valid webhook payload.
	ErrBadPayload = errors.New("webhook: invalid payload")
)

// Config configures the adapter.
type Config struct {
	// Allow lists the destinations requests may go to, each "host" (any
	// port) or "host:port"; a host is a DNS name (exact, no wildcards) or
	// an IP address. Required: a URL whose host is not listed is refused
	// without connecting. A listed name that resolves to a loopback,
	// private or link-local address is refused too, unless that address
	// is itself listed.
	Allow []string
	// DedupsOnKey lists destinations (same forms as Allow) that drop a
	// second request with the same Idempotency-Key: a request to one of
	// them whose outcome was lost is sent again with the same key.
	DedupsOnKey []string
	// Secrets sign every request (Standard Webhooks), each
	// "whsec_<base64>"; several are for rotation: each request carries a
	// signature by every one. None: requests are not signed.
	Secrets []string
	// HeaderSecrets are the values of headers that carry credentials, by
	// name: a payload's header {"secret": "NAME"} is sent with
	// HeaderSecrets[NAME]. Names are webhookkind.CheckSecretName's; a
	// value is not empty and has no CR, LF or NUL. A value never appears
	// in a log, an error or a result, also where the destination's answer
	// quotes the request: every text taken from an answer has each value
	// (its pieces and common encodings, internal/scrub) replaced by
	// "[redacted]". A payload naming a secret not here
	// is refused at enqueue through KindSpec, and failed at execute
	// without sending.
	HeaderSecrets map[string]string
	// MaxConcurrencyPerHost is the most requests in flight to one
	// host:port. Default DefaultMaxConcurrencyPerHost.
	MaxConcurrencyPerHost int
	// LookupSettle is how long after the last request to a destination a
	// lookup_url's 404 is trusted as proof that the request had no
	// effect. Zero: the runtime's (executor.Config.LookupSettle).
	LookupSettle time.Duration
	// UserAgent is sent with every request. Default "fencegate-webhook/1".
	UserAgent string
	// Logger receives warnings. Default: discard.
	Logger *slog.Logger
	// Now is the clock of webhook-timestamp. Default time.Now.
	Now func() time.Time
}

// Adapter executes webhook intents. It is safe for concurrent use.
type Adapter struct {
	cfg     Config
	allow   *Hosts
	dedups  *Hosts
	secrets []Secret
	// scrub takes HeaderSecrets' values out of the text of answers.
	scrub *scrub.Scrubber
	// client sends requests with a body, and lookups, over kept-alive
	// connections; fresh sends requests without a body, each on a
	// connection of its own (see request).
	client *http.Client
	fresh  *http.Client
	log    *slog.Logger
	// wrapConn, when set (tests), wraps every connection dialled, under
	// the byte count.
	wrapConn func(net.Conn) net.Conn

	mu    sync.Mutex
	slots map[string]chan struct{} // per host:port
}

var (
	_ adapters.Executor = (*Adapter)(nil)
	_ adapters.Looker   = (*Adapter)(nil)
)

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.MaxConcurrencyPerHost = cmp.Or(c.MaxConcurrencyPerHost, DefaultMaxConcurrencyPerHost)
	c.UserAgent = cmp.Or(c.UserAgent, "fencegate-webhook/1")
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate checks c, its defaults applied, connecting to nothing. An error
// is a *fenceerr.InvalidError naming the field (Allow, Secrets,
// HeaderSecrets, …); none repeats a secret.
func (c Config) Validate() error {
	_, err := c.WithDefaults().parse()
	return err
}

// parsed is what New keeps of a valid Config's lists.
type parsed struct {
	allow, dedups *Hosts
	secrets       []Secret
}

// parse checks c and parses its lists.
func (c Config) parse() (parsed, error) {
	var p parsed
	var err error
	switch {
	case c.MaxConcurrencyPerHost < 1:
		return p, fenceerr.Invalid("MaxConcurrencyPerHost", "must be at least 1")
	case c.LookupSettle < 0:
		return p, fenceerr.Invalid("LookupSettle", "must not be negative, got %s", c.LookupSettle)
	}
	if p.allow, err = ParseHosts("Allow", c.Allow); err != nil {
		return p, err
	}
	if p.allow.Len() == 0 {
		return p, fenceerr.Invalid("Allow", "is required: the destinations (host or host:port) requests may go to")
	}
	if p.dedups, err = ParseHosts("DedupsOnKey", c.DedupsOnKey); err != nil {
		return p, err
	}
	if p.secrets, err = ParseSecrets("Secrets", c.Secrets); err != nil {
		return p, err
	}
	return p, checkHeaderSecrets(c.HeaderSecrets)
}

// New checks cfg and returns an adapter. It connects to nothing.
func New(cfg Config) (*Adapter, error) {
	cfg = cfg.WithDefaults()
	p, err := cfg.parse()
	if err != nil {
		return nil, err
	}
	cfg.HeaderSecrets = maps.Clone(cfg.HeaderSecrets)
	var values []string
	for _, name := range slices.Sorted(maps.Keys(cfg.HeaderSecrets)) {
		values = append(values, cfg.HeaderSecrets[name])
	}
	a := &Adapter{cfg: cfg, allow: p.allow, dedups: p.dedups, secrets: p.secrets, scrub: scrub.New(values...),
		log: cfg.Logger.With("component", "webhook"), slots: map[string]chan struct{}{}}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: a.checkAddress}
	dial := func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		if a.wrapConn != nil {
			c = a.wrapConn(c)
		}
		return &countingConn{Conn: c}, nil
	}
	keepAlive := &http.Transport{
		// No proxy from the environment: the allow-list is checked
		// against the address actually dialled.
		Proxy:                 nil,
		DialContext:           dial,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   cfg.MaxConcurrencyPerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	// The Transport re-sends a request by itself only on a connection
	// that served a request before (Transport's documentation,
	// shouldRetryRequest): one connection per request rules it out for
	// the requests that cannot be made non-replayable (no body). HTTP/2
	// also resends a stream the server declared unprocessed (GOAWAY,
	// REFUSED_STREAM); do reports even that unknown once bytes of the
	// request may have left.
	fresh := keepAlive.Clone()
	fresh.DisableKeepAlives = true
	// Redirects are never followed: a 3xx is the answer (a failure).
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	a.client = &http.Client{Transport: keepAlive, CheckRedirect: noRedirect}
	a.fresh = &http.Client{Transport: fresh, CheckRedirect: noRedirect}
	return a, nil
}

// Kind returns "webhook".
func (a *Adapter) Kind() string { return Kind }

// Registration is the adapter as gateway.Config.Adapters takes it: the
// webhook kind, its intake rules with the allow-list (KindSpec: a URL to a
// host not allowed is refused at enqueue, naming the field) and the
// adapter as its executor.
func (a *Adapter) Registration() adapters.Registration {
	return adapters.Registration{Kind: Kind, Spec: a.KindSpec(), Executor: a}
}

// Capabilities: lookups where a payload names an allowed lookup_url,
// resends where the destination is in DedupsOnKey (ForRequest), at most
// MaxConcurrencyPerHost requests per destination (enforced here).
func (a *Adapter) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{Lookup: true, LookupSettle: a.cfg.LookupSettle, ForRequest: a.forRequest}
}

// forRequest says what req's destination can do: resend when it dedups on
// the key (an operator listed it), else a lookup when the payload names an
// allowed lookup_url, else nothing (an unknown outcome is held).
func (a *Adapter) forRequest(req adapters.Request) adapters.RequestCapabilities {
	p, err := webhookkind.ParseStored(req.Payload)
	if err != nil {
		return adapters.RequestCapabilities{}
	}
	if u, err := url.Parse(p.URL); err == nil {
		if host, port := hostPort(u); a.dedups.Match(host, port) {
			return adapters.RequestCapabilities{DedupsOnKey: true}
		}
	}
	if p.LookupURL != "" {
		if u, err := url.Parse(p.LookupURL); err == nil && a.allowed(u) {
			return adapters.RequestCapabilities{Lookup: true}
		}
	}
	return adapters.RequestCapabilities{}
}

// Allowed reports whether rawURL's host is in Config.Allow (the check at
// enqueue; the address is checked again when connecting).
func (a *Adapter) Allowed(rawURL string) bool {
	u, err := url.Parse(rawURL)
	return err == nil && a.allowed(u)
}

func (a *Adapter) allowed(u *url.URL) bool {
	host, port := hostPort(u)
	return a.allow.Match(host, port)
}

// KindSpec is the webhook kind as the gateway's own intake registers it:
// the payload rules (webhookkind) with this adapter's allow-list and
// header secrets, so that a URL whose host is not allowed, or a header
// naming a secret the adapter does not hold, is refused at enqueue,
// naming the field.
func (a *Adapter) KindSpec() outbox.KindSpec {
	return Intake{allow: a.allow, secrets: slices.Collect(maps.Keys(a.cfg.HeaderSecrets)), checkSecrets: true}.KindSpec()
}

// Intake is the webhook kind's intake rules with what an intake knows of
// the adapter's configuration, for an intake that does not run the
// adapter (gateway enqueue, from the environment gateway run reads).
type Intake struct {
	allow        *Hosts
	secrets      []string
	checkSecrets bool
}

// NewIntake returns the rules with the allow-list allow (each "host" or
// "host:port"; none: any host) and, when secretNames is not nil, the names
// of the header secrets the adapter holds (nil: names are not checked).
// An error names the Config field the list stands for (Allow,
// HeaderSecrets).
func NewIntake(allow []string, secretNames []string) (Intake, error) {
	hosts, err := ParseHosts("Allow", allow)
	if err != nil {
		return Intake{}, err
	}
	for _, name := range secretNames {
		if err := webhookkind.CheckSecretName("HeaderSecrets", name); err != nil {
			return Intake{}, err
		}
	}
	return Intake{allow: hosts, secrets: secretNames, checkSecrets: secretNames != nil}, nil
}

// KindSpec is the webhook kind with these rules (fence commit).
func (in Intake) KindSpec() outbox.KindSpec {
	return outbox.KindSpec{DefaultFence: outbox.FenceCommit, Check: func(raw json.RawMessage) error {
		p, err := webhookkind.Parse(raw)
		if err != nil {
			return err
		}
		if in.allow.Len() > 0 {
			if err := checkAllowed(in.allow, p); err != nil {
				return err
			}
		}
		if in.checkSecrets {
			return checkSecretsHeld(p, func(name string) bool { return slices.Contains(in.secrets, name) })
		}
		return nil
	}}
}

// checkSecretsHeld refuses a header naming a secret that held says is
// not held, naming the header's field (the first, by name).
func checkSecretsHeld(p webhookkind.Payload, held func(string) bool) error {
	for _, name := range slices.Sorted(maps.Keys(p.Headers)) {
		if s := p.Headers[name].Secret; s != "" && !held(s) {
			return fenceerr.Invalid("payload.headers."+name, "names secret %q, which the gateway does not hold (--webhook-header-secret %s=FILE)", s, s)
		}
	}
	return nil
}

// checkHeaderSecrets checks Config.HeaderSecrets, naming a bad secret
// but never echoing its value.
func checkHeaderSecrets(secrets map[string]string) error {
	for _, name := range slices.Sorted(maps.Keys(secrets)) {
		if err := webhookkind.CheckSecretName("HeaderSecrets", name); err != nil {
			return err
		}
		switch v := secrets[name]; {
		case v == "":
			return fenceerr.Invalid("HeaderSecrets", "secret %q is empty", name)
		case strings.ContainsAny(v, "\r\n\x00"):
			return fenceerr.Invalid("HeaderSecrets", "secret %q contains CR, LF or NUL (a header value cannot)", name)
		}
	}
	return nil
}

func (a *Adapter) checkAllowed(p webhookkind.Payload) error { return checkAllowed(a.allow, p) }

func checkAllowed(allow *Hosts, p webhookkind.Payload) error {
	for _, f := range []struct{ field, raw string }{{"payload.url", p.URL}, {"payload.lookup_url", p.LookupURL}} {
		if f.raw == "" {
			continue
		}
		u, err := url.Parse(f.raw)
		if err != nil {
			return fenceerr.Invalid(f.field, "is not a valid URL")
		}
		if host, port := hostPort(u); !allow.Match(host, port) {
			return fenceerr.Invalid(f.field, "host %s is not an allowed destination (--webhook-allow: %s)", net.JoinHostPort(host, strconv.Itoa(port)), allow)
		}
	}
	return nil
}

// checkAddress runs when a connection is about to be made, after DNS
// resolution, with the address actually dialled: an internal address is
// refused unless it is listed itself. Checking here, not the name before
// dialling, is what defeats a name that resolves to an internal address
// (or is rebound to one between a check and the dial).
func (a *Adapter) checkAddress(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrInternalAddress, address)
	}
	if ip := ap.Addr().Unmap(); internal(ip) && !a.allow.MatchIP(ip, int(ap.Port())) {
		return fmt.Errorf("%w: %s", ErrInternalAddress, ap)
	}
	return nil
}

// Result is the JSON object recorded for a request that succeeded.
type Result struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	// Body is the response body, up to MaxResultBody bytes; BodyBase64
	// instead when it is not UTF-8 text.
	Body       string `json:"body"`
	BodyBase64 string `json:"body_base64,omitempty"`
	Truncated  bool   `json:"truncated"`
	ElapsedMS  int64  `json:"elapsed_ms"`
	// FoundBy is "lookup" when the outcome was found by the lookup_url
	// after the request's own answer was lost.
	FoundBy string `json:"found_by,omitempty"`
}

// resultHeaders are the response headers kept in a result: none that can
// carry a credential or a session (Set-Cookie, WWW-Authenticate, …).
var resultHeaders = []string{"Content-Type", "Content-Length", "Date", "Etag", "Last-Modified", "Location",
	"Retry-After", "Request-Id", "X-Request-Id", "Idempotency-Key", "Idempotent-Replayed"}

// Execute sends req's request once. See the package documentation for how
// its outcomes are classified.
func (a *Adapter) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	p, u, headers, err := a.parse(req)
	if err != nil {
		return adapters.Outcome{}, err
	}
	sc := a.scrubber(p)
	for _, name := range slices.Sorted(maps.Keys(p.Headers)) {
		if h := p.Headers[name]; h.Secret == "" && webhookkind.Sensitive(name, h.Value) {
			// Stored before such values were refused at enqueue: sent as
			// accepted, and said (never the value) so that it is moved
			// to a secret.
			a.log.Warn("webhook: the intent's payload carries a credential inline; give it as {\"secret\": NAME} (--webhook-header-secret)",
				"intent_id", req.IntentID, "header", name)
		}
	}
	body, ctype := p.Content()
	waitStart := time.Now()
	release, err := a.slot(ctx, u)
	if err != nil {
		return adapters.Outcome{}, adapters.RetryableError(fmt.Errorf("webhook: waiting for a free connection to %s: %w", u.Host, err))
	}
	// The wait for a slot counts against the execute timeout. A request
	// sent with less than half of what was left before the wait could be
	// cut short after it left: an unknown outcome for what is only a busy
	// destination. Not sent, it is retried.
	if dl, ok := ctx.Deadline(); ok {
		if left, before := time.Until(dl), dl.Sub(waitStart); left < before/2 {
			release()
			return adapters.Outcome{}, adapters.RetryableError(fmt.Errorf("webhook: waited %s for a free connection to %s, leaving %s of the execute timeout: not sent",
				time.Since(waitStart).Round(time.Millisecond), u.Host, left.Round(time.Millisecond)))
		}
	}
	defer release()
	hr, err := a.request(ctx, req, p.MethodOr(), u, headers, body, ctype)
	if err != nil {
		return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf("%w: %v", ErrBadPayload, err))
	}
	// The last check before the request leaves: an attempt that lost its
	// key must not send (the new owner decides). Not sent: retryable.
	if err := req.StillOwner(ctx); err != nil {
		return adapters.Outcome{}, adapters.RetryableError(err)
	}
	client := a.client
	if hr.Body == nil {
		client = a.fresh
	}
	res, status, hdr, err := a.do(client, hr, true, sc)
	if err != nil {
		return adapters.Outcome{}, err
	}
	what := fmt.Sprintf("webhook: %s %s: %d %s", hr.Method, redact(u), status, http.StatusText(status))
	location := ""
	if loc := hdr.Get("Location"); loc != "" {
		location = sc.String(redactRaw(loc))
	}
	excerpt := func(res Result) string {
		if res.Body == "" {
			return ""
		}
		// Errors go to logs and spans, which never show a URL's query:
		// the request's query, and a redirect's, are taken out of the
		// body's excerpt too.
		esc := sc.WithValues(minQueryValue, queryValues(u.RawQuery)...)
		if lu, err := url.Parse(hdr.Get("Location")); err == nil {
			esc = esc.WithValues(minQueryValue, queryValues(lu.RawQuery)...)
		}
		return excerpt(esc, res)
	}
	switch {
	case status >= 200 && status < 300:
		b, _ := json.Marshal(res)
		return adapters.Outcome{Status: outbox.StatusSucceeded, Result: b}, nil
	case refusedUnprocessed(status):
		return adapters.Outcome{}, adapters.RetryableAfter(errors.New(what+excerpt(res)), adapters.RetryAfter(hdr.Get("Retry-After"), a.cfg.Now()))
	case status == http.StatusNotImplemented || status == http.StatusHTTPVersionNotSupported:
		// The receiver does not do what was asked (the method, the HTTP
		// version): nothing was acted on, and asking again will not help.
		return adapters.Outcome{}, adapters.PermanentError(errors.New(what + excerpt(res)))
	case status >= 500:
		// An error from after the request arrived: the receiver failed
		// while (or after) acting on it, or a proxy in front of it gave up
		// waiting for its answer (502, 504). Neither says the effect did
		// not happen, so retrying as if nothing happened could perform it
		// twice, and running out of attempts would record failed for an
		// effect that may have happened. Unknown: resent with the same
		// key where the receiver dedups (after its Retry-After, if it gave
		// one), looked up at lookup_url, else held for an operator.
		return adapters.Outcome{}, &adapters.Error{Unknown: true, RetryAfter: adapters.RetryAfter(hdr.Get("Retry-After"), a.cfg.Now()),
			Err: fmt.Errorf("%s: the receiver may have acted on the request before it failed%s", what, excerpt(res))}
	case status == http.StatusConflict && fencedOut(hdr, req.Epoch) > 0:
		// The receiver fenced this request out: it holds a newer epoch
		// for the resource (Fencegate-Current-Epoch). That is superseded,
		// not a failure: the stale write was refused where it mattered.
		b, _ := json.Marshal(map[string]any{"superseded_by_epoch": fencedOut(hdr, req.Epoch), "fenced_at": "destination", "status": status})
		return adapters.Outcome{Status: outbox.StatusSuperseded, Result: b}, nil
	case status == http.StatusMovedPermanently || status == http.StatusTemporaryRedirect || status == http.StatusPermanentRedirect:
		// The resource is elsewhere (a URL to fix): the request was not
		// acted on here.
		return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf("%s: redirects are not followed (Location %q)%s", what, location, excerpt(res)))
	case status >= 300 && status < 400:
		// 302 and 303 are how many servers answer a write they performed
		// (post, redirect, get: "see the result over there"); the others
		// say nothing either way. Not followed, and not failed: the
		// effect may have happened.
		return adapters.Outcome{}, adapters.UnknownError(fmt.Errorf("%s: redirects are not followed (Location %q), and a %d may answer a request the receiver acted on%s", what, location, status, excerpt(res)))
	default:
		return adapters.Outcome{}, adapters.PermanentError(errors.New(what + excerpt(res)))
	}
}

// Lookup asks the payload's lookup_url whether req's effect happened: 2xx
// is found (the result is the lookup's answer, found_by "lookup"), 404 is
// not found; anything else, or no answer, is an error (looked up again).
func (a *Adapter) Lookup(ctx context.Context, req adapters.Request) (adapters.Outcome, bool, error) {
	p, _, headers, err := a.parse(req)
	if err != nil {
		return adapters.Outcome{}, false, err
	}
	if p.LookupURL == "" {
		return adapters.Outcome{}, false, errors.New("webhook: the payload has no lookup_url")
	}
	u, err := url.Parse(p.LookupURL)
	if err != nil || !a.allowed(u) {
		return adapters.Outcome{}, false, adapters.PermanentError(fmt.Errorf("%w: lookup_url", ErrNotAllowed))
	}
	hr, err := a.request(ctx, req, http.MethodGet, u, headers, nil, "")
	if err != nil {
		return adapters.Outcome{}, false, err
	}
	sc := a.scrubber(p)
	res, status, _, err := a.do(a.client, hr, false, sc)
	switch {
	case err != nil:
		return adapters.Outcome{}, false, fmt.Errorf("webhook: look up %s: %w", redact(u), err)
	case status == http.StatusNotFound:
		return adapters.Outcome{}, false, nil
	case status >= 200 && status < 300:
		res.FoundBy = "lookup"
		b, _ := json.Marshal(res)
		return adapters.Outcome{Status: outbox.StatusSucceeded, Result: b}, true, nil
	}
	err = fmt.Errorf("webhook: look up %s: %d %s%s", redact(u), status, http.StatusText(status),
		excerpt(sc.WithValues(minQueryValue, queryValues(u.RawQuery)...), res))
	if status >= 400 && status < 500 && !refusedUnprocessed(status) {
		// Refused for good (401, 403, 405, 410, …): asking again will not
		// answer, so the runtime holds the intent for an operator.
		return adapters.Outcome{}, false, adapters.PermanentError(err)
	}
	return adapters.Outcome{}, false, err
}

// parse checks req: a valid payload (as stored: webhookkind.ParseStored)
// to an allowed host, naming only secrets the adapter holds. It returns
// the headers to send, each secret's value in place of its name. Errors
// are permanent: nothing was sent.
func (a *Adapter) parse(req adapters.Request) (webhookkind.Payload, *url.URL, map[string]string, error) {
	p, err := webhookkind.ParseStored(req.Payload)
	if err != nil {
		return p, nil, nil, adapters.PermanentError(fmt.Errorf("%w: %v", ErrBadPayload, err))
	}
	if req.IdempotencyKey == "" {
		return p, nil, nil, adapters.PermanentError(fmt.Errorf("%w: the intent has no idempotency key", ErrBadPayload))
	}
	if err := a.checkAllowed(p); err != nil {
		return p, nil, nil, adapters.PermanentError(fmt.Errorf("%w: %v", ErrNotAllowed, err))
	}
	if err := checkSecretsHeld(p, func(name string) bool { _, ok := a.cfg.HeaderSecrets[name]; return ok }); err != nil {
		return p, nil, nil, adapters.PermanentError(fmt.Errorf("%w: %v", ErrBadPayload, err))
	}
	headers := make(map[string]string, len(p.Headers))
	for name, h := range p.Headers {
		headers[name] = h.Value
		if h.Secret != "" {
			headers[name] = a.cfg.HeaderSecrets[h.Secret]
		}
	}
	u, _ := url.Parse(p.URL) // checked by Parse
	return p, u, headers, nil
}

// request builds the HTTP request: the payload's headers, then the
// gateway's own (which the payload cannot set), then the signatures.
//
// It is built so that net/http never sends it twice. net/http's Transport
// resends a request on a new connection, inside one Do, when a reused
// connection fails after the request was written and the request is
// "replayable" (Request.isReplayable, shouldRetryRequest): GET and the
// like, and any request carrying an Idempotency-Key header — every request
// here — that has no body or a GetBody to rewind one. A receiver that
// acted and then dropped the connection would get the request twice
// without the runtime knowing. So a body is given without GetBody: a body
// that cannot be rewound is never sent again (that also turns off the
// resend of a request nothing of which was written, a safe one: do
// classifies that case as not sent, retryable, and the runtime retries).
// A request without a body cannot be made non-replayable without changing
// what is sent (NoBody with the header is replayable; a non-nil empty
// body would go chunked instead of with Content-Length: 0): Execute sends
// it on a connection of its own (Adapter.fresh), which the Transport never
// resends on. Lookups are GETs: resending one is
// harmless.
func (a *Adapter) request(ctx context.Context, req adapters.Request, method string, u *url.URL, headers map[string]string, body []byte, ctype string) (*http.Request, error) {
	hr, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		// A parse error's text is the whole URL: without it.
		return nil, clientErr(err)
	}
	if len(body) > 0 {
		hr.Body, hr.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	for k, v := range headers {
		hr.Header.Set(k, v)
	}
	hr.Header.Set("User-Agent", a.cfg.UserAgent)
	if ctype != "" {
		hr.Header.Set("Content-Type", ctype)
	}
	hr.Header.Set(HeaderIdempotencyKey, req.IdempotencyKey)
	hr.Header.Set(HeaderResource, req.Resource)
	hr.Header.Set(HeaderEpoch, strconv.FormatInt(req.Epoch, 10))
	hr.Header.Set(HeaderIntentID, strconv.FormatInt(req.IntentID, 10))
	if len(a.secrets) > 0 {
		id, ts := WebhookID(req.IdempotencyKey), a.cfg.Now()
		hr.Header.Set(HeaderWebhookID, id)
		hr.Header.Set(HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
		hr.Header.Set(HeaderWebhookSignature, Sign(a.secrets, id, ts, body))
	}
	return hr, nil
}

// do sends hr with client and reads the answer. Its error is classified:
// refused before any of the request left this process (no connection,
// DNS, TLS, a stale connection that failed at the first write) is
// retryable; an internal address is permanent; anything after bytes of
// the request may have reached the server — a reset, a timeout, no reply
// — is unknown: the destination may have acted on it. For a write, a
// request net/http sent again on another connection after it may have
// reached the server on the first (which request rules out; this is the
// check that it stays so) is unknown too, whatever the answer.
//
// The exchange is an HTTP client span, whose trace context the request
// carries (startClientSpan).
//
// Every text kept of the answer (the body, the headers kept) has sc's
// credentials taken out: a receiver may quote the request.
func (a *Adapter) do(client *http.Client, hr *http.Request, write bool, sc *scrub.Scrubber) (_ Result, _ int, _ http.Header, err error) {
	ctx, span := startClientSpan(hr)
	var answered int // the answer's status code, 0 while none came
	var cause error  // what the HTTP client returned, unwrapped
	defer func() { endClientSpan(span, answered, cause, err) }()
	st := &sendTrace{}
	trace := &httptrace.ClientTrace{GotConn: st.gotConn, WroteHeaderField: st.wroteHeaderField}
	hr = hr.WithContext(httptrace.WithClientTrace(ctx, trace))
	start := time.Now()
	resp, err := client.Do(hr)
	sent, replayed := st.state()
	if err != nil {
		// Without the *url.Error around it, whose text is the whole URL,
		// query included; the messages name the URL redacted. Its text
		// may quote bytes of the answer (a malformed status line).
		err = sc.Error(clientErr(err))
		cause = err
		switch {
		case !sent && errors.Is(err, ErrInternalAddress):
			return Result{}, 0, nil, adapters.PermanentError(fmt.Errorf("webhook: %s %s: %w", hr.Method, redact(hr.URL), err))
		case !sent:
			return Result{}, 0, nil, adapters.RetryableError(fmt.Errorf("webhook: %s %s: not sent: %w", hr.Method, redact(hr.URL), err))
		case write && replayed:
			return Result{}, 0, nil, adapters.UnknownError(fmt.Errorf("webhook: %s %s: %s, and no answer came: %w", hr.Method, redact(hr.URL), errReplayed, err))
		}
		return Result{}, 0, nil, adapters.UnknownError(fmt.Errorf("webhook: %s %s: the request was sent and no answer came: %w", hr.Method, redact(hr.URL), err))
	}
	answered = resp.StatusCode
	if write && replayed {
		resp.Body.Close()
		return Result{}, 0, nil, adapters.UnknownError(fmt.Errorf("webhook: %s %s: %s (answered %d by the last)", hr.Method, redact(hr.URL), errReplayed, resp.StatusCode))
	}
	defer resp.Body.Close()
	res := Result{Status: resp.StatusCode, Headers: map[string]string{}}
	for _, h := range resultHeaders {
		if v := resp.Header.Get(h); v != "" {
			if h == "Location" {
				// Without its query and credentials, as errors show it.
				v = redactRaw(v)
			}
			res.Headers[h] = sc.String(v)
		}
	}
	data, rerr := io.ReadAll(io.LimitReader(resp.Body, MaxResultBody+1))
	if len(data) > MaxResultBody || rerr != nil {
		// Cut off: without a credential's start at the end, which the
		// scrubber cannot recognise without its rest.
		data, res.Truncated = sc.Cut(data), true
	}
	data = sc.Bytes(data)
	if len(data) > MaxResultBody {
		data = data[:MaxResultBody]
	}
	if rerr != nil {
		// The status line came: the destination answered. A body cut off
		// is kept as far as it came.
		a.log.Warn("webhook: response body cut off", "url", redact(hr.URL), "status", resp.StatusCode, "error", rerr)
	}
	if utf8.Valid(data) {
		res.Body = string(data)
	} else {
		res.BodyBase64 = base64.StdEncoding.EncodeToString(data)
	}
	res.ElapsedMS = time.Since(start).Milliseconds()
	return res, resp.StatusCode, resp.Header, nil
}

// slot waits for one of the destination's MaxConcurrencyPerHost slots.
func (a *Adapter) slot(ctx context.Context, u *url.URL) (func(), error) {
	host, port := hostPort(u)
	key := net.JoinHostPort(host, strconv.Itoa(port))
	a.mu.Lock()
	ch, ok := a.slots[key]
	if !ok {
		ch = make(chan struct{}, a.cfg.MaxConcurrencyPerHost)
		a.slots[key] = ch
	}
	a.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// refusedUnprocessed reports whether status refuses the request before the
// receiver processed it: it timed out reading it (408), will not take
// early data (425), or asks the client to come back later (429, 503,
// with Retry-After). A retry cannot perform the effect twice.
func refusedUnprocessed(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// HeaderCurrentEpoch is the header a receiver answers a 409 with when it
// refuses a request whose Fencegate-Epoch is older than the resource's
// epoch it holds: the intent is then superseded.
const HeaderCurrentEpoch = "Fencegate-Current-Epoch"

// fencedOut is the newer epoch a 409 names (HeaderCurrentEpoch), or 0
// when it names none above epoch.
func fencedOut(h http.Header, epoch int64) int64 {
	cur, err := strconv.ParseInt(h.Get(HeaderCurrentEpoch), 10, 64)
	if err != nil || cur <= epoch {
		return 0
	}
	return cur
}

// excerpt is the start of a response body for an error message, with
// sc's credentials taken out before it is cut (the body's own are, by do).
func excerpt(sc *scrub.Scrubber, res Result) string {
	b := sc.String(res.Body)
	if b == "" {
		return ""
	}
	if len(b) > 200 {
		b = b[:200] + "…"
	}
	return ": " + strconv.Quote(b)
}

// minQueryValue is the shortest value of a URL's query parameter taken
// out of an error's excerpt of an answer: a credential, an API key, is
// longer; shorter ones (ids, flags) would take words out of the text.
const minQueryValue = 8

// queryValues are a URL query's values, decoded and as written, and the
// query itself.
func queryValues(rawQuery string) []string {
	if rawQuery == "" {
		return nil
	}
	out := []string{rawQuery}
	for _, pair := range strings.Split(rawQuery, "&") {
		_, v, _ := strings.Cut(pair, "=")
		out = append(out, v)
		if dec, err := url.QueryUnescape(v); err == nil {
			out = append(out, dec)
		}
	}
	return out
}

// scrubber takes the adapter's header secrets out of answers to p's
// requests, and the credentials p's headers carry inline (an intent
// stored before they were refused at enqueue: webhookkind.Sensitive).
func (a *Adapter) scrubber(p webhookkind.Payload) *scrub.Scrubber {
	var inline []string
	for _, name := range slices.Sorted(maps.Keys(p.Headers)) {
		if h := p.Headers[name]; h.Secret == "" && webhookkind.Sensitive(name, h.Value) {
			inline = append(inline, h.Value)
		}
	}
	if len(inline) == 0 {
		return a.scrub
	}
	return a.scrub.With(inline...)
}

// redact is a URL as it may appear in logs and errors: scheme, host and
// path, without the query (where API keys travel) or credentials.
func redact(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// clientErr is an error of http.Client.Do without the *url.Error around
// it: that error's text is the request's whole URL, query included (where
// API keys travel), and wrapped after a redacted prefix it would put the
// query into last_error, the attempt history and logs. The errors inside
// keep what callers test: errors.Is (context.DeadlineExceeded,
// ErrInternalAddress, …) and net.Error's Timeout.
func clientErr(err error) error {
	for {
		ue, ok := err.(*url.Error)
		if !ok || ue.Err == nil {
			return err
		}
		err = ue.Err
	}
}

func redactRaw(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable)"
	}
	return redact(u)
}
