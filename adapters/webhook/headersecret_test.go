package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
	"github.com/fencegate/fencegate/outbox"
)

// billingToken is a header secret's value: it must reach the receiver and
// nothing else.
const billingToken = "Bearer hs-7Qm2xR9vLk4pZt8w"

// expectField checks that err is an InvalidError naming field whose
// message does not echo leak.
func expectField(t *testing.T, what string, err error, field, leak string) {
	t.Helper()
	var inv *fenceerr.InvalidError
	if !errors.As(err, &inv) || inv.Field != field {
		t.Errorf("%s: %v, want an InvalidError naming %s", what, err, field)
		return
	}
	if leak != "" && strings.Contains(err.Error(), leak) {
		t.Errorf("%s: the error echoes the value: %v", what, err)
	}
}

// A header naming a secret ({"secret": NAME}) is sent with the secret's
// value, through the gateway's intake (the adapter's KindSpec), the relay
// and the runtime, to a real receiver; the value is nowhere in the
// stored intent (payload, result, last error).
func TestHeaderSecretSent(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}, HeaderSecrets: map[string]string{"billing-api": billingToken}})
	e := adaptertest.NewEnv(t, adaptertest.Options{Executors: []adapters.Executor{a},
		Kinds: map[string]outbox.KindSpec{webhook.Kind: a.KindSpec()}})
	key := adaptertest.UniqueKey(t)
	p := payload(rc.URL+"/charge", map[string]any{"headers": map[string]any{
		"Authorization": map[string]string{"secret": "billing-api"}, "X-Tenant": "t1"}})
	rec := e.WaitStatus(t, enqueue(t, e, key, p), outbox.StatusSucceeded)
	got := rc.got(key)
	if len(got) != 1 {
		t.Fatalf("%d requests, want 1", len(got))
	}
	if h := got[0].Header; h.Get("Authorization") != billingToken || h.Get("X-Tenant") != "t1" {
		t.Errorf("the receiver got Authorization %q, X-Tenant %q; want the secret's value and t1", h.Get("Authorization"), h.Get("X-Tenant"))
	}
	stored, _ := json.Marshal(rec)
	if strings.Contains(string(stored), "hs-7Qm2xR9vLk4pZt8w") {
		t.Errorf("the secret's value is in the stored intent: %s", stored)
	}
	if !strings.Contains(string(rec.Payload), `"secret":"billing-api"`) && !strings.Contains(string(rec.Payload), `"secret": "billing-api"`) {
		t.Errorf("the stored payload %s does not name the secret", rec.Payload)
	}
	t.Logf("1 request carried the secret; stored intent checked (%d bytes)", len(stored))
}

// The lookup carries the secret's value too (it sends the request's
// headers).
func TestHeaderSecretLookup(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		_, _ = io.WriteString(w, `{"found":true}`)
	}))
	t.Cleanup(srv.Close)
	a := newAdapter(t, webhook.Config{Allow: []string{"127.0.0.1"}, HeaderSecrets: map[string]string{"billing-api": billingToken}})
	p := payload(srv.URL+"/charge", map[string]any{"lookup_url": srv.URL + "/lookup",
		"headers": map[string]any{"Authorization": map[string]string{"secret": "billing-api"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, found, err := a.Lookup(ctx, request(adaptertest.UniqueKey(t), p))
	if err != nil || !found {
		t.Fatalf("Lookup: found %v, %v", found, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auth) != 1 || auth[0] != billingToken {
		t.Fatalf("the lookup carried Authorization %q, want the secret's value once", auth)
	}
	if strings.Contains(string(out.Result), "hs-7Qm2xR9vLk4pZt8w") {
		t.Errorf("the lookup's result carries the secret: %s", out.Result)
	}
}

// A header naming a secret the adapter does not hold is refused at the
// gateway's intake, naming the header; stored by a path that cannot know
// the secrets (a Go worker with outbox.DefaultKinds), it fails at execute,
// nothing sent.
func TestHeaderSecretUnknown(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}, HeaderSecrets: map[string]string{"billing-api": billingToken}})
	p := payload(rc.URL+"/charge", map[string]any{"headers": map[string]any{"X-Partner-Auth": map[string]string{"secret": "partner"}}})
	expectField(t, "intake", a.KindSpec().Check(p), "payload.headers.X-Partner-Auth", "")

	e := adaptertest.NewEnv(t, adaptertest.Options{Executors: []adapters.Executor{a}})
	key := adaptertest.UniqueKey(t)
	rec := e.WaitStatus(t, enqueue(t, e, key, p), outbox.StatusFailed)
	if rec.LastError == nil || !strings.Contains(*rec.LastError, "payload.headers.X-Partner-Auth") || !strings.Contains(*rec.LastError, `"partner"`) {
		t.Errorf("last error %v, want it to name payload.headers.X-Partner-Auth and the secret", rec.LastError)
	}
	if n := rc.total(); n != 0 {
		t.Errorf("%d requests sent for a secret the adapter does not hold, want 0", n)
	}
	if strings.Contains(*rec.LastError, "hs-7Qm2xR9vLk4pZt8w") {
		t.Errorf("the last error carries another secret's value: %s", *rec.LastError)
	}
}

// A credential given inline is refused at enqueue, naming the header and
// never echoing the value: by the kind's own rules (a Go worker's
// outbox.DefaultKinds) and by the gateway's intake.
func TestInlineCredentialRefused(t *testing.T) {
	t.Parallel()
	a := newAdapter(t, webhook.Config{Allow: []string{"h.example"}, HeaderSecrets: map[string]string{"x": "v"}})
	checks := map[string]func(json.RawMessage) error{"kind": outbox.DefaultKinds()[webhook.Kind].Check, "intake": a.KindSpec().Check}
	cases := []struct{ name, value string }{
		{"Authorization", "Bearer abc123-inline"}, {"authorization", "abc123-inline"}, {"Proxy-Authorization", "Basic abc123-inline"},
		{"Cookie", "sid=abc123-inline"}, {"X-Api-Key", "abc123-inline"}, {"X-Auth-Token", "abc123-inline"}, {"X-Client-Secret", "abc123-inline"},
		{"X-Password", "abc123-inline"}, {"api_key", "abc123-inline"}, {"X-Session-Id", "abc123-inline"}, {"X-Upstream-Credentials", "abc123-inline"},
		{"X-Jwt-Assertion", "abc123-inline"}, {"X-Forward", "Bearer abc123-inline"}, {"X-Forward", " basic\tabc123-inline"},
	}
	n := 0
	for what, check := range checks {
		for _, tc := range cases {
			p, _ := json.Marshal(map[string]any{"url": "https://h.example/x", "headers": map[string]string{tc.name: tc.value}})
			expectField(t, what+" "+string(p), check(p), "payload.headers."+tc.name, "abc123-inline")
			n++
		}
		for _, ok := range []string{
			`{"url":"https://h.example/x","headers":{"X-Tenant":"t1","Accept":"application/json","X-Basically":"Basics"}}`,
			`{"url":"https://h.example/x","headers":{"Authorization":{"secret":"x"},"X-Custom":{"secret":"x"}}}`,
		} {
			if err := check(json.RawMessage(ok)); err != nil {
				t.Errorf("%s %s: %v", what, ok, err)
			}
			n++
		}
		for _, tc := range []struct{ payload, field string }{
			{`{"url":"https://h.example/x","headers":{"Authorization":{"secret":""}}}`, "payload.headers.Authorization"},
			{`{"url":"https://h.example/x","headers":{"Authorization":{"secret":1}}}`, "payload.headers.Authorization"},
			{`{"url":"https://h.example/x","headers":{"Authorization":{"secret":"a b"}}}`, "payload.headers.Authorization"},
			{`{"url":"https://h.example/x","headers":{"Authorization":{"secret":"x","value":"v"}}}`, "payload.headers.Authorization"},
			{`{"url":"https://h.example/x","headers":{"Authorization":{"name":"x"}}}`, "payload.headers.Authorization"},
			{`{"url":"https://h.example/x","headers":{"Idempotency-Key":{"secret":"x"}}}`, "payload.headers.Idempotency-Key"},
		} {
			expectField(t, what+" "+tc.payload, check(json.RawMessage(tc.payload)), tc.field, "")
			n++
		}
	}
	t.Logf("%d payloads checked", n)
}

// Header secrets' bad configuration names webhook_header_secret without
// echoing a value.
func TestHeaderSecretConfigErrors(t *testing.T) {
	t.Parallel()
	for _, secrets := range []map[string]string{
		{"a b": "v-abc123"}, {"": "v-abc123"}, {strings.Repeat("n", 65): "v-abc123"},
		{"ok": ""}, {"ok": "v-abc123\r\nX-Evil: 1"}, {"ok": "v-abc123\x00"},
	} {
		_, err := webhook.New(webhook.Config{Allow: []string{"h"}, HeaderSecrets: secrets})
		expectField(t, "New", err, "HeaderSecrets", "v-abc123")
	}
	if _, err := webhook.New(webhook.Config{Allow: []string{"h"}, HeaderSecrets: map[string]string{"billing_api.v2-x": "v"}}); err != nil {
		t.Errorf("a valid secret refused: %v", err)
	}
}

// An intent stored before inline credentials were refused (or by a path
// that does not refuse them yet) still executes as it was accepted; the
// log says so, naming the header, never the value.
func TestStoredInlineCredentialStillSent(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	var logs toolbin.SyncBuffer
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	key := adaptertest.UniqueKey(t)
	out, err := execute(t, a, request(key, payload(rc.URL, map[string]any{"headers": map[string]string{"Authorization": "Bearer stored-abc123"}})))
	if err != nil || out.Status != outbox.StatusSucceeded {
		t.Fatalf("Execute: %v %v", out.Status, err)
	}
	if got := rc.got(key); len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer stored-abc123" {
		t.Fatalf("the receiver got %d requests, want 1 with the stored Authorization", len(got))
	}
	if !strings.Contains(logs.String(), "header=Authorization") || strings.Contains(logs.String(), "stored-abc123") {
		t.Errorf("log %q: want a warning naming the header, without the value", logs.String())
	}
}
