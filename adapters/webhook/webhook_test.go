package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/outbox"
)

func newAdapter(t *testing.T, cfg webhook.Config) *webhook.Adapter {
	t.Helper()
	a, err := webhook.New(cfg)
	if err != nil {
		t.Fatalf("webhook.New: %v", err)
	}
	return a
}

func payload(url string, extra map[string]any) json.RawMessage {
	m := map[string]any{"url": url, "body": map[string]any{"report": "nightly", "day": "2026-12-01"}}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return b
}

func request(key string, p json.RawMessage) adapters.Request {
	return adapters.Request{IntentID: 7, Resource: "report:nightly", Epoch: 3, Kind: webhook.Kind, IdempotencyKey: key, Fence: outbox.FenceCommit, Payload: p, Attempt: 1}
}

func execute(t *testing.T, a *webhook.Adapter, req adapters.Request) (adapters.Outcome, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return a.Execute(ctx, req)
}

// A 2xx: succeeded, with the gateway's headers on the request, the JSON
// body as given, and the result the contract names.
func TestSuccess(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=secret")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"r_1"}`))
	})
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}})
	key := adaptertest.UniqueKey(t)
	out, err := execute(t, a, request(key, payload(rc.URL+"/hooks/report", map[string]any{"headers": map[string]string{"X-Tenant": "k1"}})))
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if out.Status != outbox.StatusSucceeded {
		t.Fatalf("status %s, want succeeded", out.Status)
	}
	var res webhook.Result
	if err := json.Unmarshal(out.Result, &res); err != nil {
		t.Fatal(err)
	}
	if res.Status != 201 || res.Body != `{"id":"r_1"}` || res.Truncated || res.Headers["Content-Type"] != "application/json" {
		t.Errorf("result %s", out.Result)
	}
	if _, ok := res.Headers["Set-Cookie"]; ok || strings.Contains(string(out.Result), "secret") {
		t.Errorf("result keeps a header outside the safe subset: %s", out.Result)
	}
	for _, f := range []string{`"status"`, `"headers"`, `"body"`, `"elapsed_ms"`, `"truncated"`} {
		if !strings.Contains(string(out.Result), f) {
			t.Errorf("result %s has no %s", out.Result, f)
		}
	}
	got := rc.got(key)
	if len(got) != 1 {
		t.Fatalf("%d requests, want 1", len(got))
	}
	h := got[0].Header
	for name, want := range map[string]string{
		"Idempotency-Key": key, "Fencegate-Resource": "report:nightly", "Fencegate-Epoch": "3", "Fencegate-Intent-Id": "7",
		"Content-Type": "application/json", "X-Tenant": "k1",
	} {
		if h.Get(name) != want {
			t.Errorf("header %s = %q, want %q", name, h.Get(name), want)
		}
	}
	if got[0].Method != http.MethodPost || got[0].Path != "/hooks/report" {
		t.Errorf("request %s %s, want POST /hooks/report", got[0].Method, got[0].Path)
	}
	var body map[string]any
	if err := json.Unmarshal(got[0].Body, &body); err != nil || body["report"] != "nightly" {
		t.Errorf("body %s, want the payload's body", got[0].Body)
	}
	if h.Get("Webhook-Signature") != "" {
		t.Errorf("signed without a secret: %q", h.Get("Webhook-Signature"))
	}
}

// Methods and raw bodies: PUT with body_base64 and its content type;
// DELETE without a body.
func TestMethodsAndRawBody(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	a := newAdapter(t, webhook.Config{Allow: []string{"127.0.0.1"}})
	key := adaptertest.UniqueKey(t)
	p, _ := json.Marshal(map[string]any{"url": rc.URL + "/f", "method": "PUT", "body_base64": base64.StdEncoding.EncodeToString([]byte{0, 1, 2}), "content_type": "application/octet-stream"})
	if _, err := execute(t, a, request(key, p)); err != nil {
		t.Fatal(err)
	}
	g := rc.got(key)[0]
	if g.Method != "PUT" || string(g.Body) != "\x00\x01\x02" || g.Header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("got %s %q %q", g.Method, g.Body, g.Header.Get("Content-Type"))
	}
	key2 := adaptertest.UniqueKey(t)
	p, _ = json.Marshal(map[string]any{"url": rc.URL + "/f/1", "method": "DELETE"})
	if _, err := execute(t, a, request(key2, p)); err != nil {
		t.Fatal(err)
	}
	if g := rc.got(key2)[0]; g.Method != "DELETE" || len(g.Body) != 0 || g.Header.Get("Content-Type") != "" {
		t.Errorf("got %s %q %q", g.Method, g.Body, g.Header.Get("Content-Type"))
	}
}

// The status classes: 4xx and the redirects that say the resource is
// elsewhere (301, 307, 308) fail for good (a redirect is not followed);
// 408/425/429/503 are retryable with the Retry-After; any other 5xx, and
// 302/303 (how many servers answer a write they performed), are unknown:
// the receiver may have acted on the request.
func TestStatusClasses(t *testing.T) {
	t.Parallel()
	var target int
	var mu sync.Mutex
	rc := newReceiver(t, nil)
	rc.respond = func(w http.ResponseWriter, r *http.Request, n int) {
		switch r.URL.Path {
		case "/target":
			mu.Lock()
			target++
			mu.Unlock()
		case "/400":
			http.Error(w, "bad field", http.StatusBadRequest)
		case "/redirect":
			http.Redirect(w, r, rc.URL+"/target?token=s3cret", http.StatusTemporaryRedirect)
		case "/301", "/302", "/303", "/308":
			code, _ := strconv.Atoi(r.URL.Path[1:])
			http.Redirect(w, r, rc.URL+"/target", code)
		case "/501":
			http.Error(w, "no such method here", http.StatusNotImplemented)
		case "/500", "/502", "/504":
			code, _ := strconv.Atoi(r.URL.Path[1:])
			if code == http.StatusBadGateway {
				w.Header().Set("Retry-After", "11")
			}
			http.Error(w, "acted, then failed", code)
		case "/429":
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
		case "/425":
			w.WriteHeader(http.StatusTooEarly)
		case "/408":
			w.WriteHeader(http.StatusRequestTimeout)
		case "/503":
			w.Header().Set("Retry-After", time.Now().Add(90*time.Second).UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}})
	for path, want := range map[string]string{"/400": "permanent", "/redirect": "permanent", "/301": "permanent", "/308": "permanent", "/501": "permanent",
		"/429": "retryable", "/425": "retryable", "/408": "retryable", "/503": "retryable",
		"/500": "unknown", "/502": "unknown", "/504": "unknown", "/302": "unknown", "/303": "unknown"} {
		_, err := execute(t, a, request(adaptertest.UniqueKey(t), payload(rc.URL+path, nil)))
		var e *adapters.Error
		if !errors.As(err, &e) {
			t.Errorf("%s: %v, want an adapters.Error", path, err)
			continue
		}
		switch want {
		case "permanent":
			if !adapters.IsPermanent(err) {
				t.Errorf("%s: %v, want permanent", path, err)
			}
		case "retryable":
			if !adapters.IsRetryable(err) {
				t.Errorf("%s: %v, want retryable", path, err)
			}
		case "unknown":
			if !adapters.IsUnknown(err) {
				t.Errorf("%s: %v, want an unknown outcome", path, err)
			}
		}
		switch path {
		case "/429":
			if e.RetryAfter != 7*time.Second {
				t.Errorf("429 Retry-After 7: RetryAfter %s", e.RetryAfter)
			}
		case "/502":
			// Unknown, and its Retry-After still asks a resend (to a dedup
			// host) to wait: it was dropped, the resend came after the backoff.
			if e.RetryAfter != 11*time.Second {
				t.Errorf("502 Retry-After 11: RetryAfter %s", e.RetryAfter)
			}
		case "/503":
			if e.RetryAfter < 80*time.Second || e.RetryAfter > 91*time.Second {
				t.Errorf("503 Retry-After in 90s (a date): RetryAfter %s", e.RetryAfter)
			}
		case "/400":
			if !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "bad field") {
				t.Errorf("400: %v, want the status and the body's start", err)
			}
		case "/redirect":
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows the Location's query: %v", err)
			}
		}
	}
	if target != 0 {
		t.Errorf("the redirect was followed (%d requests to its target)", target)
	}
}

// Retry-After values at the edges: seconds too many for a Duration (or
// for an int64) ask for the longest wait, which the runtime bounds by
// MaxRetryAfter; they wrapped around to a short or negative delay (a
// retry within a second). Negative, garbage and past dates are no delay
// (the backoff).
func TestRetryAfterEdges(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var value string
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		mu.Lock()
		w.Header().Set("Retry-After", value)
		mu.Unlock()
		w.WriteHeader(http.StatusTooManyRequests)
	})
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}})
	for v, atLeast := range map[string]time.Duration{
		"3601": time.Hour + time.Second, "9223372037": 24 * 365 * time.Hour, "18446744074": 24 * 365 * time.Hour,
		"99999999999999999999": 24 * 365 * time.Hour, "-5": 0, "garbage": 0, "Wed, 21 Oct 2015 07:28:00 GMT": 0, "0": 0,
	} {
		mu.Lock()
		value = v
		mu.Unlock()
		_, err := execute(t, a, request(adaptertest.UniqueKey(t), payload(rc.URL, nil)))
		var e *adapters.Error
		if !errors.As(err, &e) || !adapters.IsRetryable(err) {
			t.Errorf("429 with Retry-After %q: %v, want retryable", v, err)
			continue
		}
		if e.RetryAfter < atLeast || (atLeast == 0 && e.RetryAfter != 0) {
			t.Errorf("429 with Retry-After %q: RetryAfter %s, want at least %s (0: exactly)", v, e.RetryAfter, atLeast)
		}
	}
}

// A response over 64 KiB is kept up to 64 KiB and marked truncated.
func TestOversizedResponse(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		_, _ = w.Write([]byte(strings.Repeat("x", 200<<10)))
	})
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}})
	out, err := execute(t, a, request(adaptertest.UniqueKey(t), payload(rc.URL, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var res webhook.Result
	_ = json.Unmarshal(out.Result, &res)
	if !res.Truncated || len(res.Body) != webhook.MaxResultBody {
		t.Errorf("truncated %v, body %d bytes; want true and %d", res.Truncated, len(res.Body), webhook.MaxResultBody)
	}
}

// A host not on the allow-list is refused without connecting, at enqueue
// (the gateway's KindSpec, naming the field) and at execute (failed). So
// is a listed name that resolves to a loopback address not listed itself.
func TestDestinationsAllowListed(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	_, port, _ := strings.Cut(rc.hostPort(), ":")
	a := newAdapter(t, webhook.Config{Allow: []string{"example.com", "localhost:" + port}})
	spec := a.KindSpec()
	for _, tc := range []struct {
		url, lookup string
		field       string
		wantErr     error
	}{
		{rc.URL + "/x", "", "payload.url", webhook.ErrNotAllowed},                                  // 127.0.0.1 is not listed
		{"http://example.com:8080/x", "", "", nil},                                                 // a name without a port: any port
		{"https://example.com/x", rc.URL + "/lookup", "payload.lookup_url", webhook.ErrNotAllowed}, // the lookup must be allowed too
		{"http://localhost:" + port + "/x", "", "", webhook.ErrInternalAddress},                    // listed, but resolves to 127.0.0.1
	} {
		extra := map[string]any{}
		if tc.lookup != "" {
			extra["lookup_url"] = tc.lookup
		}
		p := payload(tc.url, extra)
		err := spec.Check(p)
		var inv *fenceerr.InvalidError
		if tc.field == "" && err != nil {
			t.Errorf("enqueue %s: %v, want accepted", tc.url, err)
		}
		if tc.field != "" && (!errors.As(err, &inv) || inv.Field != tc.field) {
			t.Errorf("enqueue %s: %v, want an InvalidError naming %s", tc.url, err, tc.field)
		}
		if tc.wantErr == nil {
			continue
		}
		_, err = execute(t, a, request(adaptertest.UniqueKey(t), p))
		if !adapters.IsPermanent(err) || !errors.Is(err, tc.wantErr) {
			t.Errorf("execute %s: %v, want permanent %v", tc.url, err, tc.wantErr)
		}
	}
	if n := rc.total(); n != 0 {
		t.Errorf("the receiver got %d requests from refused destinations, want 0", n)
	}
	// The address itself listed: allowed.
	b := newAdapter(t, webhook.Config{Allow: []string{"localhost", "127.0.0.1:" + port}})
	if _, err := execute(t, b, request(adaptertest.UniqueKey(t), payload("http://localhost:"+port+"/x", nil))); err != nil {
		t.Errorf("localhost with 127.0.0.1 listed: %v", err)
	}
}

// No connection is retryable: nothing was sent.
func TestRefusedConnectionIsRetryable(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	url := rc.URL
	rc.Close()
	a := newAdapter(t, webhook.Config{Allow: []string{"127.0.0.1"}})
	_, err := execute(t, a, request(adaptertest.UniqueKey(t), payload(url, nil)))
	if !adapters.IsRetryable(err) {
		t.Errorf("connection refused: %v, want retryable", err)
	}
}

// The reference vector of the Standard Webhooks libraries.
func TestSignReferenceVector(t *testing.T) {
	t.Parallel()
	s, err := webhook.ParseSecrets("webhook_secret", []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	if err != nil {
		t.Fatal(err)
	}
	got := webhook.Sign(s, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Errorf("Sign = %q, want %q", got, want)
	}
	for _, bad := range []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_!!", "whsec_c2hvcnQ="} {
		_, err := webhook.ParseSecrets("webhook_secret", []string{bad})
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != "webhook_secret" || strings.Contains(err.Error(), bad) {
			t.Errorf("ParseSecrets(%q) = %v, want an InvalidError naming webhook_secret that does not repeat the secret", bad, err)
		}
	}
}

// verify is the Standard Webhooks verification, written from the
// specification: HMAC-SHA256 over id.timestamp.body, any "v1," signature
// in the space-separated list matching, the timestamp within 5 minutes.
func verify(secret string, h http.Header, body []byte) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing headers")
	}
	var sec int64
	if _, err := fmt.Sscan(ts, &sec); err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return errors.New("timestamp out of tolerance")
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "." + string(body)))
	want := base64.StdEncoding.EncodeToString(m.Sum(nil))
	for _, s := range strings.Split(sigs, " ") {
		if v, sig, ok := strings.Cut(s, ","); ok && v == "v1" && hmac.Equal([]byte(sig), []byte(want)) {
			return nil
		}
	}
	return errors.New("no matching signature")
}

// Signed requests verify with the reference algorithm; with two secrets
// (rotation) each verifies on its own; the webhook-id is the same on every
// attempt of a key and differs between keys.
func TestSignaturesAndRotation(t *testing.T) {
	t.Parallel()
	const oldS, newS = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_QWxhZGRpbiBzZXNhbWUgMjAyNi0xMi0wMyByb3RhdGU="
	rc := newReceiver(t, nil)
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}, Secrets: []string{oldS, newS}})
	key := adaptertest.UniqueKey(t)
	for range 2 {
		if _, err := execute(t, a, request(key, payload(rc.URL, nil))); err != nil {
			t.Fatal(err)
		}
	}
	key2 := adaptertest.UniqueKey(t)
	if _, err := execute(t, a, request(key2, payload(rc.URL, nil))); err != nil {
		t.Fatal(err)
	}
	got := rc.got(key)
	for i, g := range got {
		for _, s := range []string{oldS, newS} {
			if err := verify(s, g.Header, g.Body); err != nil {
				t.Errorf("request %d, secret %s…: %v", i, s[:10], err)
			}
		}
		if n := len(strings.Split(g.Header.Get("webhook-signature"), " ")); n != 2 {
			t.Errorf("%d signatures, want 2 (one per secret)", n)
		}
		if err := verify("whsec_"+base64.StdEncoding.EncodeToString([]byte("another secret of 24 b!")), g.Header, g.Body); err == nil {
			t.Error("a signature verified with a secret that is not configured")
		}
		tampered := append([]byte(nil), g.Body...)
		tampered[len(tampered)-2] ^= 1
		if err := verify(oldS, g.Header, tampered); err == nil {
			t.Error("a tampered body verified")
		}
	}
	// The package's own Verify agrees with the reference algorithm, and
	// refuses a replay outside the tolerance and a tampered body.
	both, _ := webhook.ParseSecrets("s", []string{newS})
	if err := webhook.Verify(both, got[0].Header, got[0].Body, time.Now(), 0); err != nil {
		t.Errorf("Verify: %v", err)
	}
	if err := webhook.Verify(both, got[0].Header, got[0].Body, time.Now().Add(10*time.Minute), 0); !errors.Is(err, webhook.ErrBadTimestamp) {
		t.Errorf("Verify 10 minutes later: %v, want ErrBadTimestamp", err)
	}
	if err := webhook.Verify(both, got[0].Header, append(got[0].Body, ' '), time.Now(), 0); !errors.Is(err, webhook.ErrBadSignature) {
		t.Errorf("Verify of another body: %v, want ErrBadSignature", err)
	}
	if got[0].Header.Get("webhook-id") != got[1].Header.Get("webhook-id") || got[0].Header.Get("webhook-id") != webhook.WebhookID(key) {
		t.Errorf("webhook-id %q then %q, want %q on every attempt", got[0].Header.Get("webhook-id"), got[1].Header.Get("webhook-id"), webhook.WebhookID(key))
	}
	if rc.got(key2)[0].Header.Get("webhook-id") == got[0].Header.Get("webhook-id") {
		t.Error("two keys share a webhook-id")
	}
}

// At most MaxConcurrencyPerHost requests in flight to one destination.
func TestConcurrencyPerHost(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) { <-gate })
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}, MaxConcurrencyPerHost: 2})
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			if _, err := execute(t, a, request(adaptertest.UniqueKey(t), payload(rc.URL, nil))); err != nil {
				t.Error(err)
			}
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for rc.total() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(gate)
	wg.Wait()
	if n := rc.maxInFlight(); n != 2 {
		t.Errorf("at most %d requests in flight, want 2", n)
	}
}

// Bad payloads are refused naming the field.
func TestPayloadRules(t *testing.T) {
	t.Parallel()
	check := outbox.DefaultKinds()[webhook.Kind].Check
	for _, tc := range []struct{ payload, field string }{
		{`{}`, "payload.url"},
		{`{"url":"ftp://h/x"}`, "payload.url"},
		{`{"url":"http:///x"}`, "payload.url"},
		{`{"url":"https://user:pw@h/x"}`, "payload.url"},
		{`{"url":"https://h/x","method":"GET"}`, "payload.method"},
		{`{"url":"https://h/x","headers":{"Idempotency-Key":"mine"}}`, "payload.headers.Idempotency-Key"},
		{`{"url":"https://h/x","headers":{"fencegate-epoch":"9"}}`, "payload.headers.fencegate-epoch"},
		{`{"url":"https://h/x","headers":{"Content-Type":"text/plain"}}`, "payload.headers.Content-Type"},
		{`{"url":"https://h/x","headers":{"X-A":"a\r\nB: c"}}`, "payload.headers.X-A"},
		{`{"url":"https://h/x","headers":{"X-A":1}}`, "payload.headers.X-A"},
		{`{"url":"https://h/x","headers":["X-A"]}`, "payload.headers"},
		{`{"url":"https://h/x","body":{},"body_base64":"AA=="}`, "payload.body"},
		{`{"url":"https://h/x","body_base64":"AA=="}`, "payload.content_type"},
		{`{"url":"https://h/x","body_base64":"!"}`, "payload.body_base64"},
		{`{"url":"https://h/x","body":1,"content_type":"text/plain"}`, "payload.content_type"},
		{`{"url":"https://h/x","lookup_url":"nope"}`, "payload.lookup_url"},
		{`{"url":"https://h/x","header":{}}`, "payload.header"},
	} {
		err := check(json.RawMessage(tc.payload))
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: %v, want an InvalidError naming %s", tc.payload, err, tc.field)
		}
	}
	for _, ok := range []string{`{"url":"https://h/x"}`, `{"url":"http://h:8080/x?a=1","method":"PATCH","body":[1,2],"headers":{"X-Tenant":"t","Authorization":{"secret":"billing"}}}`} {
		if err := check(json.RawMessage(ok)); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// Configuration errors name the input.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   webhook.Config
		field string
	}{
		{webhook.Config{}, "Allow"},
		{webhook.Config{Allow: []string{"https://h"}}, "Allow"},
		{webhook.Config{Allow: []string{"*.h"}}, "Allow"},
		{webhook.Config{Allow: []string{"h:99999"}}, "Allow"},
		{webhook.Config{Allow: []string{"h"}, DedupsOnKey: []string{"h:x"}}, "DedupsOnKey"},
		{webhook.Config{Allow: []string{"h"}, Secrets: []string{"nope"}}, "Secrets"},
		{webhook.Config{Allow: []string{"h"}, MaxConcurrencyPerHost: -1}, "MaxConcurrencyPerHost"},
	} {
		_, err := webhook.New(tc.cfg)
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("New(%+v) = %v, want an InvalidError naming %s", tc.cfg, err, tc.field)
		}
	}
}

// A refused Allow or DedupsOnKey entry is never echoed (docs/webhooks.md:
// "never echoing an entry"; an entry pasted as a URL may carry a
// password): the error names the field and the entry's position, by New
// and by NewIntake (gateway enqueue's $GATEWAY_WEBHOOK_ALLOW).
func TestHostEntriesNotEchoed(t *testing.T) {
	t.Parallel()
	const secret = "HOSTSECRET-2mW7"
	entries := []string{"http://u:" + secret + "@h", "u:" + secret + "@h", "h:" + secret, "[" + secret + "]:x", "[" + secret,
		"*." + secret + ".example", "h/" + secret, "h?" + secret}
	n := 0
	for _, e := range entries {
		list := []string{"ok.example", e}
		_, err := webhook.New(webhook.Config{Allow: list})
		expectField(t, "New Allow "+e, err, "Allow", secret)
		_, err = webhook.New(webhook.Config{Allow: []string{"ok.example"}, DedupsOnKey: list})
		expectField(t, "New DedupsOnKey "+e, err, "DedupsOnKey", secret)
		_, err = webhook.NewIntake(list, nil)
		expectField(t, "NewIntake "+e, err, "Allow", secret)
		if err != nil && !strings.Contains(err.Error(), "entry 2") {
			t.Errorf("NewIntake %s: %v, want it to name entry 2", e, err)
		}
		n += 3
	}
	t.Logf("%d refusals checked", n)
}

// An Allow entry that is neither a DNS name nor an IP address (x:1:2, a
// name with a space or a colon) is refused, naming the field: it was
// taken as a host name that never matches anything, so the allow-list
// silently allowed less than it said. Names and addresses still pass.
func TestHostEntriesMustBeNamesOrAddresses(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"x:1:2", "a b.example", "host:name:80", "ex ample", "bad!.example"} {
		_, err := webhook.New(webhook.Config{Allow: []string{bad}})
		expectField(t, "Allow "+bad, err, "Allow", "")
	}
	for _, ok := range []string{"hooks.example.com", "HOOKS.example.com.", "hooks.example.com:8443", "10.0.0.1", "[::1]:8080", "::1",
		"fe80::1", "under_score.example", "localhost", "xn--bcher-kva.example"} {
		if _, err := webhook.New(webhook.Config{Allow: []string{ok}}); err != nil {
			t.Errorf("Allow %q: %v", ok, err)
		}
	}
}
