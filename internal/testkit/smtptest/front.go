package smtptest

import (
	"errors"
	"io"
	"log"
	"net"
	"net/smtp"
	"strings"
	"sync"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
)

// Front is an SMTP server in front of another one (Mailpit, say): every
// message it receives is relayed to the upstream server before it is
// answered — except that, for the messages Late picks, it is relayed only
// after a delay, and answered after that. Give the delay past the sender's
// reply deadline and the sender sees an unknown outcome (no reply to the
// end of data) while the message does arrive upstream, a moment later: the
// destination that accepts late. A result lookup at the upstream server
// right after the deadline does not find it yet.
type Front struct {
	// Addr is the front's host:port.
	Addr string

	upstream string
	late     func(messageID string, n int) time.Duration
	srv      *gosmtp.Server
	release  chan struct{}

	mu      sync.Mutex
	pending int // messages received and not yet relayed or refused
	arrived map[string]int
	stored  map[string]int
	closed  bool
}

// NewFront starts a Front on a free 127.0.0.1 port, relaying to upstream
// (host:port). late is called for each message received, with its
// Message-ID (angle brackets included, as sent) and how many messages with
// that id arrived before it; it returns how long to hold the message
// before relaying it (zero: relay at once). The front is closed when the
// test ends.
func NewFront(t testing.TB, upstream string, late func(messageID string, n int) time.Duration) *Front {
	t.Helper()
	f := &Front{upstream: upstream, late: late, release: make(chan struct{}),
		arrived: map[string]int{}, stored: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("smtptest: listen: %v", err)
	}
	f.Addr = ln.Addr().String()
	srv := gosmtp.NewServer(gosmtp.BackendFunc(func(*gosmtp.Conn) (gosmtp.Session, error) { return &frontSession{f: f}, nil }))
	srv.Domain = "front.smtptest.local"
	srv.ReadTimeout = time.Minute
	srv.WriteTimeout = time.Minute
	srv.ErrorLog = log.New(io.Discard, "", 0)
	f.srv = srv
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(f.Close)
	return f
}

// LateStores returns, per Message-ID, how many messages were relayed
// upstream after a delay.
func (f *Front) LateStores() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.stored))
	for k, v := range f.stored {
		out[k] = v
	}
	return out
}

// Wait waits until no held message is waiting for its relay (at most
// timeout) and reports whether none is.
func (f *Front) Wait(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		f.mu.Lock()
		n := f.pending
		f.mu.Unlock()
		if n == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops the front; held messages are dropped (never relayed).
func (f *Front) Close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	close(f.release)
	f.mu.Unlock()
	_ = f.srv.Close()
}

type frontSession struct {
	f    *Front
	from string
	to   []string
}

func (s *frontSession) Mail(from string, _ *gosmtp.MailOptions) error { s.from = from; return nil }

func (s *frontSession) Rcpt(to string, _ *gosmtp.RcptOptions) error {
	s.to = append(s.to, to)
	return nil
}

func (s *frontSession) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	id := ""
	if h, err := (Message{Data: data}).Header(); err == nil {
		id = strings.TrimSpace(h.Get("Message-ID"))
	}
	f := s.f
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return errors.New("smtptest: front closed")
	}
	n := f.arrived[id]
	f.arrived[id]++
	f.pending++
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.pending--; f.mu.Unlock() }()
	delay := f.late(id, n)
	if delay > 0 {
		// The hold is the fault: the sender's deadline passes meanwhile.
		tm := time.NewTimer(delay)
		select {
		case <-tm.C:
		case <-f.release:
			tm.Stop()
			return errors.New("smtptest: front closed")
		}
	}
	// Relayed before the reply: a 250 from the front means the message is
	// upstream.
	if err := smtp.SendMail(f.upstream, nil, s.from, s.to, data); err != nil {
		return &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 0, 0}, Message: "upstream: " + err.Error()}
	}
	if delay > 0 {
		f.mu.Lock()
		f.stored[id]++
		f.mu.Unlock()
	}
	return nil
}

func (s *frontSession) Reset() { s.from, s.to = "", nil }

func (s *frontSession) Logout() error { return nil }
