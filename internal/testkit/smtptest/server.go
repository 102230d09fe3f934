// Package smtptest holds SMTP test infrastructure: an in-process SMTP server
// that records what it accepts and injects faults at chosen phases of the
// SMTP transaction, and a helper that runs a real Mailpit process.
//
// Both are "the edge of the world" fakes the style guide allows: the adapter
// under test talks real SMTP over real TCP to them.
package smtptest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/mail"
	netsmtp "net/smtp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Phase names the point of an SMTP transaction where a Fault applies.
type Phase string

// Phases a Fault can target.
const (
	// PhaseRcpt is the reply to RCPT TO (every recipient).
	PhaseRcpt Phase = "rcpt"
	// PhaseData is the final reply to the message body (after the client's
	// "." line). The body has been fully received at this point.
	PhaseData Phase = "data"
)

// Fault is a scripted misbehaviour of the Server.
//
// At PhaseRcpt the message is never stored. At PhaseData a Code rejects
// the message (not stored), while Drop and Hang store it first: the server
// accepted it, and the client never learns so.
type Fault struct {
	At Phase
	// Code is the SMTP reply code to answer with (4xx or 5xx).
	Code int
	// Message is the reply text. Default "injected fault".
	Message string
	// Drop closes the connection instead of replying.
	Drop bool
	// Hang sends no reply at all; the connection stays open until the
	// client gives up or the server is closed.
	Hang bool
	// StoreAfter (PhaseData only, without Code, Drop or Hang) makes the
	// server slow to take a message: it has the whole body, waits this
	// long, then stores it (and forwards it, see WithUpstream) and replies
	// 250 — whether or not the client is still waiting for the reply. A
	// destination that stores a message after the client gave up on it.
	StoreAfter time.Duration
}

// Message is a message the Server accepted.
type Message struct {
	From string
	To   []string
	Data []byte
	// MessageID is the Message-ID header as sent, with angle brackets.
	MessageID string
	// TLS reports whether the session used STARTTLS.
	TLS bool
	// Username is the authenticated user, if any.
	Username   string
	ReceivedAt time.Time
}

// Header parses the message's header.
func (m Message) Header() (mail.Header, error) {
	msg, err := mail.ReadMessage(bytes.NewReader(m.Data))
	if err != nil {
		return nil, err
	}
	return msg.Header, nil
}

// Option configures a Server.
type Option func(*Server)

// WithTLS makes the server offer STARTTLS with a self-signed certificate
// for 127.0.0.1 and localhost.
func WithTLS() Option {
	return func(s *Server) { s.tls = true }
}

// WithAuth makes the server offer AUTH PLAIN and require it before MAIL.
// Without WithTLS, AUTH is offered over plain text.
func WithAuth(username, password string) Option {
	return func(s *Server) { s.user, s.pass = username, password }
}

// WithUpstream makes the server forward every message it stores to the SMTP
// server at addr (for example a Mailpit), as a relay would: a fault-injecting
// front for a real destination with a search API. A message the upstream
// refuses is not stored, and the client gets a 451.
func WithUpstream(addr string) Option {
	return func(s *Server) { s.upstream = addr }
}

// Server is an SMTP server on 127.0.0.1 for tests. Its zero value is not
// usable; call NewServer.
type Server struct {
	// Addr is the server's host:port.
	Addr string

	tls        bool
	user, pass string
	upstream   string

	srv       *smtp.Server
	ln        net.Listener
	release   chan struct{} // closed on Close: ends Hang faults
	serveDone chan struct{}

	pending atomic.Int32 // messages in a StoreAfter delay

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	fault    *Fault
	messages []Message
	closed   bool
}

// NewServer starts a Server on a free 127.0.0.1 port; it is closed when the
// test ends.
func NewServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := &Server{
		release:   make(chan struct{}),
		serveDone: make(chan struct{}),
		conns:     map[net.Conn]struct{}{},
	}
	for _, o := range opts {
		o(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("smtptest: listen: %v", err)
	}
	s.ln = &trackingListener{Listener: ln, s: s}
	s.Addr = ln.Addr().String()

	srv := smtp.NewServer(smtp.BackendFunc(s.newSession))
	srv.Domain = "smtptest.local"
	srv.ReadTimeout = 30 * time.Second
	srv.WriteTimeout = 30 * time.Second
	srv.ErrorLog = log.New(io.Discard, "", 0)
	srv.AllowInsecureAuth = !s.tls
	if s.tls {
		cert, err := SelfSignedCert()
		if err != nil {
			t.Fatalf("smtptest: %v", err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	s.srv = srv
	go func() {
		defer close(s.serveDone)
		_ = srv.Serve(s.ln)
	}()
	t.Cleanup(s.Close)
	return s
}

// SetFault makes every following transaction fail as f says, until
// ClearFault.
func (s *Server) SetFault(f Fault) {
	if f.Message == "" {
		f.Message = "injected fault"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = &f
}

// ClearFault makes the server behave again.
func (s *Server) ClearFault() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = nil
}

func (s *Server) faultAt(p Phase) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fault != nil && s.fault.At == p {
		f := *s.fault
		return &f
	}
	return nil
}

// Pending returns how many received messages are still waiting out a
// StoreAfter delay (not yet stored nor forwarded).
func (s *Server) Pending() int { return int(s.pending.Load()) }

// Messages returns the messages accepted so far, oldest first.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.messages...)
}

// Count returns how many accepted messages carry Message-ID id (with or
// without angle brackets; compared exactly).
func (s *Server) Count(id string) int {
	n := 0
	for _, m := range s.Messages() {
		if trimID(m.MessageID) == trimID(id) {
			n++
		}
	}
	return n
}

// Find reports whether the server accepted a message with Message-ID id. It
// has the shape of email.Lookup, so an adapter under test can look results
// up at this server.
func (s *Server) Find(_ context.Context, id string) (bool, map[string]any, error) {
	msgs := s.Messages()
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if trimID(m.MessageID) == trimID(id) {
			return true, map[string]any{
				"received_at": m.ReceivedAt.UTC().Format(time.RFC3339Nano),
				"mail_from":   m.From,
				"rcpt_to":     m.To,
			}, nil
		}
	}
	return false, nil, nil
}

func trimID(id string) string { return strings.Trim(strings.TrimSpace(id), "<>") }

// Close stops the server, ends hanging faults and closes all connections.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.release)
	s.mu.Unlock()

	_ = s.ln.Close()
	s.mu.Lock()
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	// Outside the lock: trackedConn.Close takes it.
	for _, c := range conns {
		_ = c.Close()
	}
	// Shutdown waits for every connection handler to return; the
	// connections are closed already, so this is quick.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	<-s.serveDone
}

type trackingListener struct {
	net.Listener
	s *Server
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, s: l.s}
	l.s.conns[tc] = struct{}{}
	return tc, nil
}

type trackedConn struct {
	net.Conn
	s    *Server
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

func (s *Server) newSession(c *smtp.Conn) (smtp.Session, error) {
	return &session{s: s, conn: c}, nil
}

type session struct {
	s        *Server
	conn     *smtp.Conn
	from     string
	to       []string
	username string
}

var _ smtp.AuthSession = (*session)(nil)

func (ss *session) AuthMechanisms() []string {
	if ss.s.user == "" {
		return nil
	}
	return []string{sasl.Plain}
}

func (ss *session) Auth(mech string) (sasl.Server, error) {
	if mech != sasl.Plain || ss.s.user == "" {
		return nil, smtp.ErrAuthUnknownMechanism
	}
	return sasl.NewPlainServer(func(identity, username, password string) error {
		if username != ss.s.user || password != ss.s.pass {
			return smtp.ErrAuthFailed
		}
		ss.username = username
		return nil
	}), nil
}

func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
	if ss.s.user != "" && ss.username == "" {
		return smtp.ErrAuthRequired
	}
	ss.from = from
	return nil
}

func (ss *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if f := ss.s.faultAt(PhaseRcpt); f != nil {
		if err := ss.inject(f); err != nil {
			return err
		}
	}
	ss.to = append(ss.to, to)
	return nil
}

func (ss *session) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	f := ss.s.faultAt(PhaseData)
	if f != nil && f.StoreAfter > 0 && f.Code == 0 && !f.Drop && !f.Hang {
		// A slow destination: the message is taken late, after the
		// client may have given up waiting (the timer is the behaviour
		// under test, not a wait for something).
		ss.s.pending.Add(1)
		defer ss.s.pending.Add(-1)
		t := time.NewTimer(f.StoreAfter)
		select {
		case <-t.C:
		case <-ss.s.release:
			t.Stop()
			return errors.New("smtptest: closed before the delayed store")
		}
		f = nil
	}
	if f != nil && !f.Drop && !f.Hang {
		// A rejected message is not stored: the reply tells the client so.
		return ss.inject(f)
	}
	msg := Message{
		From:       ss.from,
		To:         append([]string(nil), ss.to...),
		Data:       data,
		Username:   ss.username,
		ReceivedAt: time.Now(),
	}
	if h, err := msg.Header(); err == nil {
		msg.MessageID = strings.TrimSpace(h.Get("Message-ID"))
	}
	_, msg.TLS = ss.conn.TLSConnectionState()
	if ss.s.upstream != "" {
		if err := smtpSend(ss.s.upstream, msg); err != nil {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 0, 0}, Message: "upstream: " + err.Error()}
		}
	}
	ss.s.mu.Lock()
	ss.s.messages = append(ss.s.messages, msg)
	ss.s.mu.Unlock()
	if f != nil {
		// Stored first, then the reply is lost: the server has the message
		// and the client cannot know it.
		return ss.inject(f)
	}
	return nil
}

// smtpSend forwards msg to the SMTP server at addr.
func smtpSend(addr string, msg Message) error {
	return netsmtp.SendMail(addr, nil, msg.From, msg.To, msg.Data)
}

// inject applies f: a reply error, a dropped connection or a hang.
func (ss *session) inject(f *Fault) error {
	switch {
	case f.Drop:
		_ = ss.conn.Conn().Close()
		return errors.New("smtptest: connection dropped")
	case f.Hang:
		<-ss.s.release
		_ = ss.conn.Conn().Close()
		return errors.New("smtptest: hung")
	}
	enh := smtp.EnhancedCode{f.Code / 100, 0, 0}
	return &smtp.SMTPError{Code: f.Code, EnhancedCode: enh, Message: f.Message}
}

func (ss *session) Reset() {
	ss.from = ""
	ss.to = nil
}

func (ss *session) Logout() error { return nil }

// String describes the fault, for test names.
func (f Fault) String() string {
	switch {
	case f.Drop:
		return fmt.Sprintf("drop at %s", f.At)
	case f.Hang:
		return fmt.Sprintf("hang at %s", f.At)
	case f.StoreAfter > 0 && f.Code == 0:
		return fmt.Sprintf("store after %s at %s", f.StoreAfter, f.At)
	}
	return fmt.Sprintf("%d at %s", f.Code, f.At)
}
