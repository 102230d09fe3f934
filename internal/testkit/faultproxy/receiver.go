package faultproxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Receiver is an HTTP/1.1 server on 127.0.0.1 at the edge, for tests of
// answers lost at the destination itself: its handler can act on a
// request and then vanish (Vanish), and tell a request on a kept-alive
// connection that already carried one (Reused).
type Receiver struct {
	// URL is the base URL, http://127.0.0.1:port; Host its host:port.
	URL, Host string

	srv   *http.Server
	conns atomic.Int64
}

type connKey struct{}

// connState counts the requests a connection carried.
type connState struct{ n atomic.Int64 }

// NewReceiver starts a Receiver serving h. Close stops it.
func NewReceiver(h http.Handler) (*Receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rc := &Receiver{Host: ln.Addr().String()}
	rc.URL = "http://" + rc.Host
	rc.srv = &http.Server{ReadHeaderTimeout: time.Minute,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if cs, ok := r.Context().Value(connKey{}).(*connState); ok {
				cs.n.Add(1)
			}
			h.ServeHTTP(w, r)
		}),
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			rc.conns.Add(1)
			return context.WithValue(ctx, connKey{}, &connState{})
		}}
	go func() { _ = rc.srv.Serve(ln) }()
	return rc, nil
}

// Conns is the number of connections the receiver accepted.
func (rc *Receiver) Conns() int { return int(rc.conns.Load()) }

// Close stops the receiver and closes its connections.
func (rc *Receiver) Close() error { return rc.srv.Close() }

// Reused reports whether r, served by a Receiver, came on a kept-alive
// connection that carried a request before.
func Reused(r *http.Request) bool {
	cs, ok := r.Context().Value(connKey{}).(*connState)
	return ok && cs.n.Load() > 1
}

// Vanish closes the request's connection without a word: the destination
// acted on the request (the handler read it in full first) and is gone
// before it answers, a crash after its commit. A client cannot tell it
// from a kept-alive connection the server closed while idle.
func Vanish(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
	}
}

// DropReceiver is a Receiver that acts on every request (counts it by its
// Idempotency-Key) and answers 200 on the same kept-alive connection,
// except the first request for the key it drops: that one it reads in
// full, counts and then vanishes (Vanish). A later request for that key is
// answered as usual (the destination came back).
type DropReceiver struct {
	*Receiver
	drop, contentType, body string

	mu       sync.Mutex
	requests map[string]int
	dropped  bool
}

// StartDropReceiver starts a DropReceiver dropping the first request for
// key drop (none when empty) and answering the others 200 with body of
// contentType; it is closed when the test ends.
func StartDropReceiver(t testing.TB, drop, contentType, body string) *DropReceiver {
	t.Helper()
	d := &DropReceiver{drop: drop, contentType: contentType, body: body, requests: map[string]int{}}
	rc, err := NewReceiver(http.HandlerFunc(d.serve))
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	d.Receiver = rc
	t.Cleanup(func() { _ = rc.Close() })
	return d
}

// Requests is the number of requests for key the receiver acted on.
func (d *DropReceiver) Requests(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.requests[key]
}

func (d *DropReceiver) serve(w http.ResponseWriter, r *http.Request) {
	// The whole request first: a destination acts on a request it has.
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	d.mu.Lock()
	d.requests[key]++
	drop := key == d.drop && !d.dropped
	d.dropped = d.dropped || drop
	d.mu.Unlock()
	if drop {
		Vanish(w)
		return
	}
	w.Header().Set("Content-Type", d.contentType)
	_, _ = io.WriteString(w, d.body)
}
