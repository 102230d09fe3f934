package smtptest

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/mail"
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
// right after the deadline does not find it yet. StartFront's decide
// picks besides the messages it refuses, and those it relays and then
// does not answer.
type Front struct {
	// Addr is the front's host:port.
	Addr string

	upstream string
	decide   func(messageID string, n int) FrontAction
	srv      *gosmtp.Server
	release  chan struct{}

	mu      sync.Mutex
	pending int // messages received and not yet relayed or refused
	arrived map[string]int
	relayed []Relayed
	closed  bool
}

// FrontAction is what a Front does with one message it received.
type FrontAction struct {
	// Hold relays the message only after this long, then answers.
	Hold time.Duration
	// Refuse answers with this error (an *smtp.SMTPError, say) instead:
	// the message is not relayed.
	Refuse error
	// Drop closes the connection instead of answering, once the message
	// is upstream; Reset writes the start of the 250 answer, then resets
	// the connection.
	Drop, Reset bool
}

// Relayed is a message the Front relayed upstream.
type Relayed struct {
	// MessageID is the Message-ID header as sent, with angle brackets.
	MessageID string
	// Header is the message's header (nil when it did not parse).
	Header mail.Header
	// Late: the message was held before it was relayed.
	Late bool
}

// NewFront starts a Front on a free 127.0.0.1 port, relaying to upstream
// (host:port). late is called for each message received, with its
// Message-ID (angle brackets included, as sent) and how many messages with
// that id arrived before it; it returns how long to hold the message
// before relaying it (zero: relay at once). The front is closed when the
// test ends.
func NewFront(t testing.TB, upstream string, late func(messageID string, n int) time.Duration) *Front {
	t.Helper()
	f, err := StartFront(upstream, func(id string, n int) FrontAction { return FrontAction{Hold: late(id, n)} })
	if err != nil {
		t.Fatalf("smtptest: %v", err)
	}
	t.Cleanup(f.Close)
	return f
}

// StartFront starts a Front on a free 127.0.0.1 port, relaying to upstream
// (host:port). decide is called for each message received, with its
// Message-ID and how many messages with that id arrived before it (as
// NewFront's late), and says what to do with it. Close stops the front.
func StartFront(upstream string, decide func(messageID string, n int) FrontAction) (*Front, error) {
	f := &Front{upstream: upstream, decide: decide, release: make(chan struct{}), arrived: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	f.Addr = ln.Addr().String()
	srv := gosmtp.NewServer(gosmtp.BackendFunc(func(c *gosmtp.Conn) (gosmtp.Session, error) {
		return &frontSession{f: f, conn: c.Conn()}, nil
	}))
	srv.Domain = "front.smtptest.local"
	srv.ReadTimeout = time.Minute
	srv.WriteTimeout = time.Minute
	srv.ErrorLog = log.New(io.Discard, "", 0)
	f.srv = srv
	go func() { _ = srv.Serve(ln) }()
	return f, nil
}

// Relayed returns the messages relayed upstream, in order.
func (f *Front) Relayed() []Relayed {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Relayed(nil), f.relayed...)
}

// LateStores returns, per Message-ID, how many messages were relayed
// upstream after a delay.
func (f *Front) LateStores() map[string]int {
	out := map[string]int{}
	for _, m := range f.Relayed() {
		if m.Late {
			out[m.MessageID]++
		}
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
	conn net.Conn
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
	h, _ := (Message{Data: data}).Header()
	id := strings.TrimSpace(h.Get("Message-ID"))
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
	act := f.decide(id, n)
	if act.Refuse != nil {
		return act.Refuse
	}
	if act.Hold > 0 {
		// The hold is the fault: the sender's deadline passes meanwhile.
		tm := time.NewTimer(act.Hold)
		select {
		case <-tm.C:
		case <-f.release:
			tm.Stop()
			return errors.New("smtptest: front closed")
		}
	}
	// Relayed before the reply: a 250 from the front means the message is
	// upstream, and so does a drop or a reset after this point.
	if err := smtp.SendMail(f.upstream, nil, s.from, s.to, data); err != nil {
		return &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 0, 0}, Message: "upstream: " + err.Error()}
	}
	f.mu.Lock()
	f.relayed = append(f.relayed, Relayed{MessageID: id, Header: h, Late: act.Hold > 0})
	f.mu.Unlock()
	switch {
	case act.Drop:
		_ = s.conn.Close()
		return errors.New("smtptest: connection dropped")
	case act.Reset:
		_, _ = s.conn.Write([]byte("250 2.0"))
		if tc, ok := s.conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close with a reset
		}
		_ = s.conn.Close()
		return errors.New("smtptest: connection reset")
	}
	return nil
}

func (s *frontSession) Reset() { s.from, s.to = "", nil }

func (s *frontSession) Logout() error { return nil }
