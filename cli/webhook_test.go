package cli

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// headerReceiver is a real HTTP receiver for the webhook tests: it
// answers every request 200 {"ok":true} and keeps the requests' headers
// by Idempotency-Key.
type headerReceiver struct {
	*httptest.Server
	mu  sync.Mutex
	got map[string][]http.Header
}

// newHeaderReceiver starts a headerReceiver, closed when the test ends.
func newHeaderReceiver(t *testing.T) *headerReceiver {
	r := &headerReceiver{got: map[string][]http.Header{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		key := req.Header.Get("Idempotency-Key")
		r.mu.Lock()
		r.got[key] = append(r.got[key], req.Header.Clone())
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(r.Close)
	return r
}

// headers returns the headers of the requests that came with key, in
// arrival order.
func (r *headerReceiver) headers(key string) []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got[key])
}

// `gateway run` with the webhook adapter, end to end against a real HTTP
// receiver: intents enqueued with the CLI and the HTTP intake are each sent
// once with the gateway's headers and end succeeded; a URL to a host that
// is not allowed is refused at the intake (400 naming payload.url) and
// stores nothing; a bad payload is exit 2 naming the field.
func TestRunWebhook(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)

	rcv := newHeaderReceiver(t)
	host := strings.TrimPrefix(rcv.URL, "http://")
	admin := freeAddr(t)
	p := e.run(t, []string{"GATEWAY_WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		"--adapters", "webhook", "--webhook-allow", host, "--admin-addr", admin, "--poll-interval", "200ms")

	acquireLease(t, e.db, "billing")

	// CLI: a bad payload names the field; a good one succeeds.
	bad := gw(t, e.db, "enqueue", "--resource", "billing", "--epoch", "1", "--op", "bad", "--kind", "webhook", "--payload", `{"url":"ftp://x/y"}`)
	expectInvalid(t, bad, "payload.url")
	// With the allow-list in the environment, the CLI refuses other hosts too.
	elsewhere := gwEnv(t, []string{"GATEWAY_WEBHOOK_ALLOW=" + host}, e.db, "enqueue", "--resource", "billing", "--epoch", "1", "--op", "elsewhere", "--kind", "webhook", "--payload", `{"url":"https://example.net/x"}`)
	expectInvalid(t, elsewhere, "payload.url")
	cliID := enqueue(t, e.db, "--resource", "billing", "--epoch", "1", "--op", "charge-1", "--kind", "webhook",
		"--key", "invoice-42/charge", "--payload", `{"url":"`+rcv.URL+`/charge","body":{"amount":4200}}`)

	// HTTP intake: an allowed URL is accepted; one elsewhere is 400.
	post := func(body string) (int, map[string]any) {
		waitAdmin(t, admin)
		return postJSON(t, "http://"+admin+"/api/v1/intents", "", body)
	}
	code, m := post(`{"resource":"billing","epoch":1,"operation_id":"elsewhere","kind":"webhook","payload":{"url":"https://example.net/x"}}`)
	if code != http.StatusBadRequest || m["error"].(map[string]any)["field"] != "payload.url" {
		t.Fatalf("intake, host not allowed: %d %v; want 400 naming payload.url", code, m)
	}
	if n := testdb.Int(t, e.pool, `SELECT count(*) FROM fencegate.intents WHERE operation_id = 'elsewhere'`); n != 0 {
		t.Fatalf("%d intents stored for a refused enqueue", n)
	}
	code, m = post(`{"resource":"billing","epoch":1,"operation_id":"charge-2","kind":"webhook","payload":{"url":"` + rcv.URL + `/charge","method":"PUT","body":{"amount":1}}}`)
	if code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("intake: %d %v", code, m)
	}
	httpID := m["intent_id"]

	res := resultOf(t, waitStatus(t, e.db, cliID, "succeeded"))
	if res["status"] != 200.0 || res["body"] != `{"ok":true}` {
		t.Fatalf("result %v", res)
	}
	waitStatus(t, e.db, httpID, "succeeded")
	h := rcv.headers("invoice-42/charge")
	if len(h) != 1 {
		t.Fatalf("%d requests for the CLI's intent, want 1", len(h))
	}
	for name, want := range map[string]string{"Fencegate-Resource": "billing", "Fencegate-Epoch": "1", "Fencegate-Intent-Id": jsonNum(cliID)} {
		if h[0].Get(name) != want {
			t.Errorf("%s = %q, want %q", name, h[0].Get(name), want)
		}
	}
	if !strings.HasPrefix(h[0].Get("Webhook-Signature"), "v1,") || h[0].Get("Webhook-Id") == "" {
		t.Errorf("not signed: %v", h[0])
	}
	if strings.Contains(p.stderr.String(), "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") {
		t.Fatal("the webhook secret leaked into the log")
	}
	p.stop(t)
}

// The webhook flags' bad values are exit 2 naming the field, without
// echoing a secret.
func TestRunWebhookBadFlags(t *testing.T) {
	t.Parallel()
	runBadFlagCases(t, "Zm9vYmFy", []badFlagCase{
		{"webhook without allow-list", nil, []string{"--adapters", "webhook"}, "webhook_allow"},
		{"allow-list entry is a URL", nil, []string{"--webhook-allow", "https://h.example"}, "webhook_allow"},
		{"dedups entry", nil, []string{"--webhook-allow", "h.example", "--webhook-dedups-on-key", "h.example:0"}, "webhook_dedups_on_key"},
		{"secret without prefix", []string{"GATEWAY_WEBHOOK_SECRET=Zm9vYmFyYmF6cXV4cXV1eHF1dXg="}, []string{"--webhook-allow", "h.example"}, "webhook_secret"},
		{"per-host concurrency", nil, []string{"--webhook-allow", "h.example", "--webhook-max-concurrency-per-host", "0"}, "webhook_max_concurrency_per_host"},
	})
}
