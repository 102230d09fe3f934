package admin

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// Start serves at once and only once; Stop waits for a request in flight
// (graceful) and returns once the server has stopped.
func TestServerStartStop(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s := newServer(t, pool, nil, func(c *Config) {
		c.ReadyTimeout = time.Minute
		// /readyz's NATS check is the request held in flight.
		c.NATSReady = func() error {
			once.Do(func() { close(entered) })
			<-release
			return nil
		}
	})
	ln := serve(t, context.Background(), s)
	base := "http://" + ln.Addr().String()
	if r := doReq(t, base, "GET", "/healthz", "", "", ""); r.code != 200 {
		t.Fatalf("healthz = %d %s", r.code, r.raw)
	}
	ln2, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	if err := s.Start(context.Background(), ln2); !errors.Is(err, startstop.ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}

	// Not doReq: it may call t.Fatal, which is for the test's goroutine.
	ready := make(chan error, 1)
	go func() {
		r, err := http.Get(base + "/readyz")
		if err == nil {
			r.Body.Close()
			if r.StatusCode != http.StatusOK {
				err = errors.New(r.Status)
			}
		}
		ready <- err
	}()
	<-entered
	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a request was in flight")
	case <-s.Stopped():
		t.Fatal("Stopped closed while a request was in flight")
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	select {
	case <-stopped:
	case <-time.After(15 * time.Second):
		t.Fatal("Stop did not return after the request ended")
	}
	if err := <-ready; err != nil {
		t.Fatalf("readyz in flight during Stop: %v; want it answered 200", err)
	}
	select {
	case <-s.Stopped():
	default:
		t.Fatal("Stopped not closed once Stop returned")
	}
	if err := s.Err(); err != nil {
		t.Fatalf("Err after a clean Stop = %v", err)
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the listener still accepts after Stop")
	}
	if err := s.Start(context.Background(), ln2); !errors.Is(err, startstop.ErrStarted) {
		t.Fatalf("Start after Stop = %v, want ErrStarted", err)
	}
}

// A server stops on its own when its listener fails (Err says why) or when
// Start's context ends (cleanly).
func TestServerStopsOnItsOwn(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)

	s := newServer(t, pool, nil, nil)
	ln := serve(t, context.Background(), s)
	ln.Close() // the listener fails under the server
	select {
	case <-s.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("Stopped not closed after the listener failed")
	}
	if err := s.Err(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Err = %v, want the listener's failure (net.ErrClosed)", err)
	}
	s.Stop()
	if err := s.Err(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Err after Stop = %v, want the listener's failure kept", err)
	}

	s2 := newServer(t, pool, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	ln = serve(t, ctx, s2)
	if r := doReq(t, "http://"+ln.Addr().String(), "GET", "/healthz", "", "", ""); r.code != http.StatusOK {
		t.Fatalf("healthz = %d %s", r.code, r.raw)
	}
	cancel()
	select {
	case <-s2.Stopped():
	case <-time.After(15 * time.Second):
		t.Fatal("Stopped not closed after Start's context ended")
	}
	if err := s2.Err(); err != nil {
		t.Fatalf("Err after the context ended = %v, want nil", err)
	}
}

// serve starts s with ctx on a listener of its own; s stops at the test's
// end.
func serve(t *testing.T, ctx context.Context, s *Server) net.Listener {
	t.Helper()
	ln, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx, ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return ln
}
