// Package devsmtp is the SMTP sink of `gateway dev`: a small SMTP server on
// 127.0.0.1 that accepts every message, keeps it in memory, and answers
// result lookups by Message-ID, so the email adapter's "did it arrive?"
// question has an answer without a real mail server.
//
// It is for development only: no TLS, no AUTH, no relaying, nothing
// persisted. Messages are kept in arrival order up to Config.MaxMessages;
// the oldest are dropped past it (and can then no longer be looked up).
// A message sent twice is stored twice: like a real SMTP server, the sink
// does not deduplicate, which is what makes the gateway's own dedup
// visible.
package devsmtp

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"mime"
	"net"
	"net/mail"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/fencegate/fencegate/adapters/email"
)

// Defaults of Config.
const (
	DefaultAddr            = "127.0.0.1:0"
	DefaultMaxMessages     = 1000
	DefaultMaxMessageBytes = 10 << 20
	DefaultDomain          = "devsmtp.local"
)

// Config configures a Server.
type Config struct {
	// Addr is the host:port to listen on. Default "127.0.0.1:0" (a free
	// port on the loopback interface).
	Addr string
	// MaxMessages is how many messages are kept; the oldest are dropped
	// past it. Default 1000.
	MaxMessages int
	// MaxMessageBytes is the largest message accepted. Default 10 MiB.
	MaxMessageBytes int64
	// Domain is the name the server greets with. Default "devsmtp.local".
	Domain string
	// Logger receives one line per accepted message. Default: discard.
	Logger *slog.Logger
	// Now is the clock stamped on received messages. Default time.Now.
	Now func() time.Time
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.Addr = cmp.Or(c.Addr, DefaultAddr)
	c.MaxMessages = cmp.Or(c.MaxMessages, DefaultMaxMessages)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.Domain = cmp.Or(c.Domain, DefaultDomain)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c Config) validate() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("devsmtp: Addr must be host:port, got %q", c.Addr)
	}
	if c.MaxMessages < 1 {
		return fmt.Errorf("devsmtp: MaxMessages must be at least 1, got %d", c.MaxMessages)
	}
	if c.MaxMessageBytes < 1 {
		return fmt.Errorf("devsmtp: MaxMessageBytes must be at least 1, got %d", c.MaxMessageBytes)
	}
	return nil
}

// Message is a message the sink accepted.
type Message struct {
	// Seq numbers messages in arrival order, from 1.
	Seq int64 `json:"seq"`
	// MessageID is the Message-ID header as sent, angle brackets included;
	// empty when the message had none.
	MessageID string `json:"message_id"`
	// From is the envelope sender (MAIL FROM).
	From string `json:"from"`
	// To are the envelope recipients (RCPT TO), in order.
	To []string `json:"to"`
	// Subject is the decoded Subject header.
	Subject string `json:"subject"`
	// IdempotencyKey, IntentID and Epoch are the gateway's headers
	// (email.HeaderIdempotencyKey, HeaderIntentID, HeaderEpoch), empty when
	// absent.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	IntentID       string `json:"intent_id,omitempty"`
	Epoch          string `json:"epoch,omitempty"`
	// Size is the length of Data in bytes.
	Size int `json:"size"`
	// Data is the message as received (header and body).
	Data []byte `json:"-"`
	// ReceivedAt is when the sink accepted the message.
	ReceivedAt time.Time `json:"received_at"`
}

// Header parses the message's header.
func (m Message) Header() (mail.Header, error) {
	msg, err := mail.ReadMessage(bytes.NewReader(m.Data))
	if err != nil {
		return nil, err
	}
	return msg.Header, nil
}

// Server is a running SMTP sink. Create one with Start.
type Server struct {
	cfg  Config
	addr string
	ln   net.Listener
	srv  *smtp.Server
	done chan struct{}

	mu       sync.Mutex
	seq      int64
	messages []Message // oldest first
	closed   bool
}

var _ email.Lookup = (*Server)(nil)

// Start listens on cfg.Addr and serves SMTP until Close.
func Start(cfg Config) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("devsmtp: listen on %s: %w", cfg.Addr, err)
	}
	s := &Server{cfg: cfg, addr: ln.Addr().String(), ln: ln, done: make(chan struct{})}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) {
		return &session{s: s}, nil
	}))
	srv.Domain = cfg.Domain
	srv.MaxMessageBytes = cfg.MaxMessageBytes
	srv.MaxRecipients = 1000
	srv.ReadTimeout = time.Minute
	srv.WriteTimeout = time.Minute
	srv.ErrorLog = log.New(io.Discard, "", 0)
	s.srv = srv
	go func() {
		defer close(s.done)
		_ = srv.Serve(ln)
	}()
	return s, nil
}

// Addr returns the host:port the sink listens on.
func (s *Server) Addr() string { return s.addr }

// Close stops listening, closes open connections and waits for the server
// to stop. The stored messages stay readable. Idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.done
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	// The listener is closed, and Serve waited for, before Shutdown: Serve
	// adds accepted connections to the WaitGroup Shutdown waits on, and an
	// Add racing that Wait is a data race in go-smtp.
	err := s.ln.Close()
	<-s.done
	// A client in the middle of a transaction gets a moment to finish; a
	// sink has nothing worth waiting longer for.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if serr := s.srv.Shutdown(ctx); errors.Is(serr, context.DeadlineExceeded) {
		// Closing the connections makes their handlers return at once.
		_ = s.srv.Close()
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Messages returns the stored messages, newest first.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Message, len(s.messages))
	for i, m := range s.messages {
		out[len(out)-1-i] = m
	}
	return out
}

// Message returns the stored message with sequence number seq.
func (s *Server) Message(seq int64) (Message, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.messages {
		if m.Seq == seq {
			return m, true
		}
	}
	return Message{}, false
}

// Count returns how many stored messages carry Message-ID id (see Find for
// how ids are compared).
func (s *Server) Count(id string) int {
	want := bareID(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.messages {
		if want != "" && bareID(m.MessageID) == want {
			n++
		}
	}
	return n
}

// Find reports whether a stored message has Message-ID messageID, compared
// exactly (case-sensitively) after removing surrounding white space and
// angle brackets, so "<a@b>" and "a@b" are the same id but "a@b" does not
// match "xa@b". The details are of the newest such message, with the
// number of copies received. It implements email.Lookup and never fails.
func (s *Server) Find(_ context.Context, messageID string) (bool, map[string]any, error) {
	want := bareID(messageID)
	if want == "" {
		return false, nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var newest *Message
	copies := 0
	for i := range s.messages {
		if bareID(s.messages[i].MessageID) == want {
			newest = &s.messages[i]
			copies++
		}
	}
	if newest == nil {
		return false, nil, nil
	}
	return true, map[string]any{
		"destination": "devsmtp",
		"seq":         newest.Seq,
		"received_at": newest.ReceivedAt.UTC().Format(time.RFC3339Nano),
		"mail_from":   newest.From,
		"rcpt_to":     append([]string(nil), newest.To...),
		"copies":      copies,
	}, nil
}

func bareID(id string) string {
	id = strings.TrimSpace(id)
	id = strings.TrimPrefix(id, "<")
	return strings.TrimSuffix(id, ">")
}

func (s *Server) store(m Message) Message {
	s.mu.Lock()
	s.seq++
	m.Seq = s.seq
	s.messages = append(s.messages, m)
	if over := len(s.messages) - s.cfg.MaxMessages; over > 0 {
		// Copy down so the dropped messages' memory is released.
		s.messages = append(s.messages[:0:0], s.messages[over:]...)
	}
	s.mu.Unlock()
	s.cfg.Logger.Info("devsmtp: message received", "component", "devsmtp", "seq", m.Seq,
		"message_id", m.MessageID, "from", m.From, "to", strings.Join(m.To, ","), "subject", m.Subject, "bytes", m.Size)
	return m
}

type session struct {
	s    *Server
	from string
	to   []string
}

func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
	ss.from = from
	ss.to = nil
	return nil
}

func (ss *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	ss.to = append(ss.to, to)
	return nil
}

func (ss *session) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	m := Message{
		From:       ss.from,
		To:         append([]string(nil), ss.to...),
		Data:       data,
		Size:       len(data),
		ReceivedAt: ss.s.cfg.Now(),
	}
	if msg, err := mail.ReadMessage(bytes.NewReader(data)); err == nil {
		h := msg.Header
		m.MessageID = strings.TrimSpace(h.Get("Message-ID"))
		m.Subject = decodeHeader(h.Get("Subject"))
		m.IdempotencyKey = decodeHeader(h.Get(email.HeaderIdempotencyKey))
		m.IntentID = strings.TrimSpace(h.Get(email.HeaderIntentID))
		m.Epoch = strings.TrimSpace(h.Get(email.HeaderEpoch))
	}
	ss.s.store(m)
	return nil
}

func decodeHeader(v string) string {
	d, err := new(mime.WordDecoder).DecodeHeader(v)
	if err != nil {
		return strings.TrimSpace(v)
	}
	return strings.TrimSpace(d)
}

func (ss *session) Reset() {
	ss.from = ""
	ss.to = nil
}

func (ss *session) Logout() error { return nil }
