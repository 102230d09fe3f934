package cli

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/faultproxy"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// `gateway run` with the webhook adapter and the default --unknown-outcome
// hold, to a receiver not in --webhook-dedups-on-key that acts on a request
// and drops its kept-alive connection before answering: the request
// reaches it once, and the intent ends unknown with its key held for an
// operator — the gateway's HTTP client does not quietly send it again on a
// new connection and record the second answer.
func TestRunWebhookDroppedKeepAliveHeld(t *testing.T) {
	t.Parallel()
	db, pool := runPool(t)
	expectCode(t, gw(t, db, "migrate"), 0, "")
	ns := natstest.Start(t)
	const key = "invoice-7/charge"
	rc := faultproxy.StartDropReceiver(t, key, "application/json", `{"ok":true}`)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the receiver got %d request(s) for the key over %d connection(s)", rc.Requests(key), rc.Conns())
		}
	})
	host := rc.Host
	p := startRun(t, nil, db, ns.URL, "--adapters", "webhook", "--webhook-allow", host, "--poll-interval", "200ms")
	expectCode(t, gw(t, db, "lease", "acquire", "--resource", "billing", "--holder", "A", "--ttl", "60s"), 0, "")

	// The first intent warms a kept-alive connection; the second is then
	// written on it.
	warm := enqueue(t, db, "--resource", "billing", "--epoch", "1", "--op", "charge-6", "--kind", "webhook",
		"--key", "invoice-6/charge", "--payload", `{"url":"http://`+host+`/charge","body":{"amount":600}}`)
	waitStatus(t, db, warm, "succeeded")
	id := enqueue(t, db, "--resource", "billing", "--epoch", "1", "--op", "charge-7", "--kind", "webhook",
		"--key", key, "--payload", `{"url":"http://`+host+`/charge","body":{"amount":700}}`)
	st := waitStatus(t, db, id, "unknown")

	requests, conns := rc.Requests(key), rc.Conns()
	t.Logf("intent %s: %s, attempts %v, last_error %v; %d request(s) for the key, %d connection(s)", jsonNum(id), st["status"], st["attempts"], st["last_error"], requests, conns)
	if requests != 1 {
		t.Errorf("the receiver got %d requests for the key, want 1", requests)
	}
	if conns != 1 {
		t.Errorf("%d connections, want 1: the request under test was not written on the kept-alive connection", conns)
	}
	if n := testdb.Int(t, pool, `SELECT count(*) FROM fencegate.idempotency_keys WHERE kind = 'webhook' AND idempotency_key = $1 AND state = 'held' AND status = 'unknown'`, key); n != 1 {
		t.Errorf("%d held keys %q, want 1", n, key)
	}
	if le, _ := st["last_error"].(string); !strings.Contains(le, "no answer") {
		t.Errorf("last_error %q, want the unknown outcome's reason", le)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.stderr.String())
	}
}
