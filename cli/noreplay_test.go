package cli

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/natstest"
)

// actThenDrop is a raw HTTP/1.1 receiver at the edge, speaking keep-alive:
// it answers 200 on the same connection, except the first request for the
// key it drops: that one it reads in full, records (it acts: a crash after
// commit, a proxy reset) and then closes the connection without answering.
// A later request for that key is answered 200 (the receiver came back).
type actThenDrop struct {
	ln   net.Listener
	drop string

	mu       sync.Mutex
	requests map[string]int // by Idempotency-Key
	conns    int
	dropped  bool
	open     []net.Conn
	wg       sync.WaitGroup
}

func startActThenDrop(t *testing.T, drop string) *actThenDrop {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc := &actThenDrop{ln: ln, drop: drop, requests: map[string]int{}}
	rc.wg.Add(1)
	go func() {
		defer rc.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rc.mu.Lock()
			rc.conns++
			rc.open = append(rc.open, c)
			rc.mu.Unlock()
			rc.wg.Add(1)
			go rc.serve(c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		rc.mu.Lock()
		for _, c := range rc.open {
			_ = c.Close()
		}
		rc.mu.Unlock()
		rc.wg.Wait()
	})
	return rc
}

func (rc *actThenDrop) serve(c net.Conn) {
	defer rc.wg.Done()
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		key := r.Header.Get("Idempotency-Key")
		rc.mu.Lock()
		rc.requests[key]++
		drop := key == rc.drop && !rc.dropped
		rc.dropped = rc.dropped || drop
		rc.mu.Unlock()
		if drop {
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"); err != nil {
			return
		}
	}
}

func (rc *actThenDrop) counts(key string) (requests, conns int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.requests[key], rc.conns
}

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
	rc := startActThenDrop(t, key)
	t.Cleanup(func() {
		if t.Failed() {
			requests, conns := rc.counts(key)
			t.Logf("the receiver got %d request(s) for the key over %d connection(s)", requests, conns)
		}
	})
	host := rc.ln.Addr().String()
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

	requests, conns := rc.counts(key)
	t.Logf("intent %s: %s, attempts %v, last_error %v; %d request(s) for the key, %d connection(s)", jsonNum(id), st["status"], st["attempts"], st["last_error"], requests, conns)
	if requests != 1 {
		t.Errorf("the receiver got %d requests for the key, want 1", requests)
	}
	if conns != 1 {
		t.Errorf("%d connections, want 1: the request under test was not written on the kept-alive connection", conns)
	}
	if n := scalar(t, pool, `SELECT count(*) FROM fencegate.idempotency_keys WHERE kind = 'webhook' AND idempotency_key = $1 AND state = 'held' AND status = 'unknown'`, key); n != 1 {
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
