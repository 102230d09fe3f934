package httpserver

import (
	"bufio"
	"net"
	"net/http"
	"testing"
	"time"
)

// Every timeout is set: a server with one of them zero can be held open by
// a slow client.
func TestNewSetsEveryTimeout(t *testing.T) {
	t.Parallel()
	s := New(http.NotFoundHandler(), nil)
	for name, d := range map[string]time.Duration{
		"ReadHeaderTimeout": s.ReadHeaderTimeout, "ReadTimeout": s.ReadTimeout,
		"WriteTimeout": s.WriteTimeout, "IdleTimeout": s.IdleTimeout,
	} {
		if d <= 0 {
			t.Errorf("%s is %s", name, d)
		}
	}
}

// A client that sends half a request is cut off (here with a short read
// header timeout, to keep the test fast).
func TestSlowClientIsCutOff(t *testing.T) {
	t.Parallel()
	s := New(http.NotFoundHandler(), nil)
	s.ReadHeaderTimeout = 200 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	defer s.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, err = bufio.NewReader(c).ReadString('\n')
	if err == nil {
		// An error response (408) is fine too; what matters is the close.
		_, err = bufio.NewReader(c).ReadString(0)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("a half-sent request was held %s", time.Since(start))
	}
}
