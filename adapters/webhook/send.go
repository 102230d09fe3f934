package webhook

import (
	"crypto/tls"
	"net"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
)

// errReplayed is what an outcome says when the request may have reached
// the destination more than once inside one attempt.
const errReplayed = "the request may have reached the destination twice: the HTTP client sent it again on a new connection after it may have been received on the first"

// countingConn counts the bytes written to a connection the adapter
// dialled: the bytes the kernel took, that may reach the server. It sits
// under TLS, so a TLS connection's count is found through NetConn.
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// counted is the countingConn under c (a connection the Transport hands
// to GotConn), nil if there is none.
func counted(c net.Conn) *countingConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	cc, _ := c.(*countingConn)
	return cc
}

// sendTrace follows one Do through httptrace: on which connections the
// request went, and whether any of it may have left this process.
//
// Each connection attempt begins with GotConn. The request may have
// reached the server on it only if both its header fields were produced
// (WroteHeaderField: the request line and Host are in the connection's
// buffer; before that no server holds a request it can act on) and the
// connection's byte count moved after GotConn (the buffer was flushed, at
// least in part, to the kernel). The byte count makes a stale kept-alive
// connection whose first write failed provably "not sent", where the
// header fields alone could not (they are written into a buffer first).
// On an HTTP/2 connection other requests move the count too, so there
// it errs on the side of "may have been sent".
type sendTrace struct {
	mu       sync.Mutex
	attempts int
	conn     *countingConn // the current attempt's connection; nil: not countable
	mark     int64         // its count at GotConn
	headers  bool          // the current attempt wrote header fields
	earlier  bool          // an earlier attempt may have reached the server
	replayed bool          // a new attempt began after one that may have
}

func (s *sendTrace) gotConn(info httptrace.GotConnInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.attempts > 0 && s.currentMaySendLocked() {
		s.earlier, s.replayed = true, true
	}
	s.attempts++
	s.conn, s.mark, s.headers = counted(info.Conn), 0, false
	if s.conn != nil {
		s.mark = s.conn.written.Load()
	}
}

func (s *sendTrace) wroteHeaderField(string, []string) {
	s.mu.Lock()
	s.headers = true
	s.mu.Unlock()
}

func (s *sendTrace) currentMaySendLocked() bool {
	switch {
	case s.attempts == 0 || !s.headers:
		return false
	case s.conn == nil:
		return true
	}
	return s.conn.written.Load() > s.mark
}

// state says whether the request may have reached the server, and
// whether a connection attempt followed one that may have delivered it.
func (s *sendTrace) state() (sent, replayed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.earlier || s.currentMaySendLocked(), s.replayed
}
