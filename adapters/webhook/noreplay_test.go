package webhook_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/internal/testkit/faultproxy"
	"github.com/fencegate/fencegate/outbox"
)

// A receiver that acts on a request and drops its keep-alive connection
// before answering gets that request once: the client does not send it
// again on a new connection by itself, and the outcome is unknown (the
// receiver is not in DedupsOnKey: only the runtime may decide to resend).
// The same for a request without a body (POST and DELETE), which net/http
// would replay with no body to rewind.
func TestDroppedKeepAliveIsNotReplayed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		extra map[string]any
		// conns: a request with a body goes on the warmed connection; one
		// without, on a connection of its own.
		conns int
	}{
		{"json body", nil, 1},
		{"raw body", map[string]any{"body": nil, "body_base64": "AAEC", "content_type": "application/octet-stream"}, 1},
		{"no body", map[string]any{"body": nil}, 2},
		{"delete", map[string]any{"body": nil, "method": "DELETE"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := adaptertest.UniqueKey(t)
			rc := faultproxy.StartDropReceiver(t, key, "text/plain", "ok")
			a := newAdapter(t, webhook.Config{Allow: []string{rc.Host}})
			p := noreplayPayload(rc.URL+"/hooks", tc.extra)
			// Warm a keep-alive connection: the request under test is
			// then written on a reused connection, the one net/http
			// replays on.
			warm := adaptertest.UniqueKey(t) + "-warm"
			if out, err := execute(t, a, request(warm, p)); err != nil || out.Status != outbox.StatusSucceeded {
				t.Fatalf("warm-up: %v %s", err, out.Status)
			}
			out, err := execute(t, a, request(key, p))
			if !adapters.IsUnknown(err) {
				t.Errorf("Execute: %v (status %q), want an unknown outcome", err, out.Status)
			}
			if n := rc.Requests(key); n != 1 {
				t.Errorf("the receiver got %d requests for the key, want 1", n)
			}
			if n := rc.Conns(); n != tc.conns {
				t.Errorf("%d connections, want %d", n, tc.conns)
			}
			t.Logf("%s: %v; %d request(s) for the key over %d connection(s)", tc.name, err, rc.Requests(key), rc.Conns())
		})
	}
}

// noreplayPayload is payload with extra fields; a nil value removes one.
func noreplayPayload(url string, extra map[string]any) json.RawMessage {
	m := map[string]any{"url": url, "body": map[string]any{"report": "nightly"}}
	for k, v := range extra {
		if v == nil {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return b
}

// failWrites fails every write of the connections it wraps while armed,
// before any byte leaves: a kept-alive connection the peer reset while it
// sat idle.
type failWrites struct {
	net.Conn
	armed *atomic.Bool
}

func (c failWrites) Write(p []byte) (int, error) {
	if c.armed.Load() {
		return 0, syscall.EPIPE
	}
	return c.Conn.Write(p)
}

// A kept-alive connection that fails at the first write of a request
// (nothing of it left the process) is "not sent": retryable, not unknown,
// and the retry sends it once.
func TestStaleConnectionNothingWrittenIsRetryable(t *testing.T) {
	t.Parallel()
	key := adaptertest.UniqueKey(t)
	rc := faultproxy.StartDropReceiver(t, "", "text/plain", "ok")
	a := newAdapter(t, webhook.Config{Allow: []string{rc.Host}})
	var armed atomic.Bool
	webhook.WrapConns(a, func(c net.Conn) net.Conn { return failWrites{Conn: c, armed: &armed} })
	p := noreplayPayload(rc.URL+"/hooks", nil)
	if _, err := execute(t, a, request(adaptertest.UniqueKey(t)+"-warm", p)); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	armed.Store(true)
	_, err := execute(t, a, request(key, p))
	if !adapters.IsRetryable(err) || !strings.Contains(err.Error(), "not sent") {
		t.Fatalf("a write that failed before any byte left: %v, want retryable, not sent", err)
	}
	if n := rc.Requests(key); n != 0 {
		t.Fatalf("the receiver got %d requests for the key, want 0", n)
	}
	armed.Store(false)
	if out, err := execute(t, a, request(key, p)); err != nil || out.Status != outbox.StatusSucceeded {
		t.Fatalf("the retry: %v %s", err, out.Status)
	}
	if n := rc.Requests(key); n != 1 {
		t.Errorf("the receiver got %d requests for the key, want 1", n)
	}
}

// The defence behind the request's shape: a request the HTTP client does
// treat as replayable (a rewindable body and an Idempotency-Key, built
// here by hand) is sent again on a new connection after the receiver
// dropped the first; the adapter sees the second connection and reports
// an unknown outcome, though the second copy was answered 200.
func TestReplayIsDetected(t *testing.T) {
	t.Parallel()
	key := adaptertest.UniqueKey(t)
	rc := faultproxy.StartDropReceiver(t, key, "text/plain", "ok")
	a := newAdapter(t, webhook.Config{Allow: []string{rc.Host}})
	send := func(key string) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, rc.URL+"/hooks", strings.NewReader(`{"n":1}`))
		if err != nil {
			t.Fatal(err)
		}
		hr.Header.Set("Idempotency-Key", key)
		return webhook.SendWrite(a, hr)
	}
	if status, err := send(key + "-warm"); err != nil || status != 200 {
		t.Fatalf("warm-up: %d %v", status, err)
	}
	status, err := send(key)
	if !adapters.IsUnknown(err) || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a request replayed by the client: %d %v, want an unknown outcome naming the second copy", status, err)
	}
	if n := rc.Requests(key); n != 2 {
		t.Errorf("the receiver got %d requests for the key, want 2 (net/http replays such a request)", n)
	}
}
