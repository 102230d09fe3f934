package webhook_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/outbox"
)

// dropReceiver is a raw HTTP/1.1 server at the edge, speaking keep-alive:
// it answers every request 200 "ok" on the same connection, except the
// first request for the key it is told to drop: that one it reads in full,
// records (it acts on it: a crash after commit) and then closes the
// connection without a word. Later requests for that key are answered as
// usual (the receiver came back).
type dropReceiver struct {
	ln   net.Listener
	URL  string
	drop string

	mu       sync.Mutex
	requests map[string]int // by Idempotency-Key
	conns    int
	dropped  bool
	wg       sync.WaitGroup
}

func newDropReceiver(t *testing.T, drop string) *dropReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc := &dropReceiver{ln: ln, URL: "http://" + ln.Addr().String(), drop: drop, requests: map[string]int{}}
	rc.wg.Add(1)
	go rc.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		rc.wg.Wait()
	})
	return rc
}

func (rc *dropReceiver) accept() {
	defer rc.wg.Done()
	var open []net.Conn
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	for {
		c, err := rc.ln.Accept()
		if err != nil {
			return
		}
		rc.mu.Lock()
		rc.conns++
		rc.mu.Unlock()
		open = append(open, c)
		rc.wg.Add(1)
		go rc.serve(c)
	}
}

func (rc *dropReceiver) serve(c net.Conn) {
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
		if drop {
			rc.dropped = true
		}
		rc.mu.Unlock()
		if drop {
			return // acted on it; gone before answering
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
		if r.Close {
			return
		}
	}
}

func (rc *dropReceiver) count(key string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.requests[key]
}

func (rc *dropReceiver) connections() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.conns
}

func (rc *dropReceiver) hostPort() string { return strings.TrimPrefix(rc.URL, "http://") }

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
			rc := newDropReceiver(t, key)
			a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}})
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
			if n := rc.count(key); n != 1 {
				t.Errorf("the receiver got %d requests for the key, want 1", n)
			}
			if n := rc.connections(); n != tc.conns {
				t.Errorf("%d connections, want %d", n, tc.conns)
			}
			t.Logf("%s: %v; %d request(s) for the key over %d connection(s)", tc.name, err, rc.count(key), rc.connections())
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
	rc := newDropReceiver(t, "")
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}})
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
	if n := rc.count(key); n != 0 {
		t.Fatalf("the receiver got %d requests for the key, want 0", n)
	}
	armed.Store(false)
	if out, err := execute(t, a, request(key, p)); err != nil || out.Status != outbox.StatusSucceeded {
		t.Fatalf("the retry: %v %s", err, out.Status)
	}
	if n := rc.count(key); n != 1 {
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
	rc := newDropReceiver(t, key)
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}})
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
	if n := rc.count(key); n != 2 {
		t.Errorf("the receiver got %d requests for the key, want 2 (net/http replays such a request)", n)
	}
}
