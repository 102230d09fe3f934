package chaos

import (
	"bytes"
	"errors"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/mail"
	"net/smtp"
	"strconv"
	"strings"
	"sync"
	"time"

	gosmtp "github.com/emersion/go-smtp"
)

// The SMTP front's faults, armed by the nemesis (Arm) for a number of
// messages each. The email adapter opens a connection per message, so
// every message comes on a fresh connection.
const (
	// SMTPDrop stores the message, then closes the connection instead of
	// answering the end of its data.
	SMTPDrop = "smtp_drop"
	// SMTPLate stores the message after the sender's reply deadline, then
	// answers.
	SMTPLate = "smtp_late"
	// SMTPBusy refuses the message with a 421 or 451 (try again later);
	// not stored.
	SMTPBusy = "smtp_busy"
	// SMTPReset stores the message, then resets the connection part-way
	// through the 250 answer.
	SMTPReset = "smtp_reset"
)

// SMTPFaults are the SMTP front's fault kinds.
var SMTPFaults = []string{SMTPDrop, SMTPLate, SMTPBusy, SMTPReset}

// SMTPFront is the email destination of the chaos run: an SMTP server that
// stores each message by relaying it to a real one (Mailpit) before it
// answers, and misbehaves on the messages armed faults pick. Besides,
// lateHold picks messages to store late, by their Message-ID, from the
// run's seed.
type SMTPFront struct {
	// Addr is the front's host:port.
	Addr string

	upstream string
	late     time.Duration
	lateHold func(messageID string, n int) time.Duration
	srv      *gosmtp.Server
	done     chan struct{}

	mu       sync.Mutex
	rng      *rand.Rand
	armed    map[string]int
	injected map[string]int
	arrived  map[string]int
	// lateStores counts, per Message-ID, the messages stored after the
	// sender's deadline; byIntent the messages stored per intent id (the
	// X-Fencegate-Intent-Id of the attempt that sent it).
	lateStores map[string]int
	byIntent   map[int64]int
	stored     int
	pending    int
	closed     bool
}

// NewSMTPFront starts a front on a free 127.0.0.1 port relaying to
// upstream (host:port). A late store comes after late (the sender's reply
// deadline); lateHold (may be nil) holds the messages it picks besides.
func NewSMTPFront(seed uint64, upstream string, late time.Duration, lateHold func(messageID string, n int) time.Duration) (*SMTPFront, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &SMTPFront{Addr: ln.Addr().String(), upstream: upstream, late: late, lateHold: lateHold, done: make(chan struct{}),
		rng: rand.New(rand.NewPCG(seed, 0x5e7d)), armed: map[string]int{}, injected: map[string]int{},
		arrived: map[string]int{}, lateStores: map[string]int{}, byIntent: map[int64]int{}}
	srv := gosmtp.NewServer(gosmtp.BackendFunc(func(c *gosmtp.Conn) (gosmtp.Session, error) {
		return &frontSession{f: f, conn: c.Conn()}, nil
	}))
	srv.Domain = "front.chaos.local"
	srv.ReadTimeout = time.Minute
	srv.WriteTimeout = time.Minute
	srv.ErrorLog = log.New(io.Discard, "", 0)
	f.srv = srv
	go func() { _ = srv.Serve(ln) }()
	return f, nil
}

// Arm makes the next n messages misbehave with fault.
func (f *SMTPFront) Arm(fault string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed[fault] += n
}

// Disarm drops the faults not yet applied.
func (f *SMTPFront) Disarm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.armed)
}

// Injected returns how often each fault was applied.
func (f *SMTPFront) Injected() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copyCounts(f.injected)
}

// LateStores returns, per Message-ID, how many messages were stored after
// the sender's deadline.
func (f *SMTPFront) LateStores() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copyCounts(f.lateStores)
}

// StoredByIntent returns, per intent id, the messages stored that its
// attempts sent.
func (f *SMTPFront) StoredByIntent() map[int64]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[int64]int, len(f.byIntent))
	for k, v := range f.byIntent {
		out[k] = v
	}
	return out
}

// Stored is the number of messages stored.
func (f *SMTPFront) Stored() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stored
}

// Wait waits until no message is being held (at most timeout) and reports
// whether none is.
func (f *SMTPFront) Wait(timeout time.Duration) bool {
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

// Close stops the front; held messages are dropped.
func (f *SMTPFront) Close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	close(f.done)
	f.mu.Unlock()
	_ = f.srv.Close()
}

type frontSession struct {
	f    *SMTPFront
	conn net.Conn
	from string
	to   []string
}

func (s *frontSession) Mail(from string, _ *gosmtp.MailOptions) error { s.from = from; return nil }

func (s *frontSession) Rcpt(to string, _ *gosmtp.RcptOptions) error {
	s.to = append(s.to, to)
	return nil
}

// errDropped ends a session whose connection the front closed itself.
var errDropped = errors.New("chaos: connection dropped")

func (s *frontSession) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	id, intent := "", int64(0)
	if m, err := mail.ReadMessage(bytes.NewReader(data)); err == nil {
		id = strings.TrimSpace(m.Header.Get("Message-ID"))
		intent, _ = strconv.ParseInt(strings.TrimSpace(m.Header.Get("X-Fencegate-Intent-Id")), 10, 64)
	}
	f := s.f
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return errors.New("chaos: front closed")
	}
	fault := ""
	for _, k := range SMTPFaults {
		if f.armed[k] > 0 {
			f.armed[k]--
			f.injected[k]++
			fault = k
			break
		}
	}
	n := f.arrived[id]
	f.arrived[id]++
	hold := time.Duration(0)
	switch {
	case fault == SMTPLate:
		hold = f.late + 100*time.Millisecond + time.Duration(f.rng.IntN(1400))*time.Millisecond
	case fault == "" && f.lateHold != nil:
		hold = f.lateHold(id, n)
	}
	busyCode := 421
	if f.rng.IntN(2) == 0 {
		busyCode = 451
	}
	f.pending++
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.pending--; f.mu.Unlock() }()

	if fault == SMTPBusy {
		return &gosmtp.SMTPError{Code: busyCode, EnhancedCode: gosmtp.EnhancedCode{4, 3, 2}, Message: "busy, try again later"}
	}
	if hold > 0 {
		// The hold is the fault: the sender's deadline passes meanwhile.
		select {
		case <-time.After(hold):
		case <-f.done:
			return errors.New("chaos: front closed")
		}
	}
	// Stored before the answer: a 250 from the front means the message is
	// upstream, and so does a drop or a reset after this point.
	if err := smtp.SendMail(f.upstream, nil, s.from, s.to, data); err != nil {
		return &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 0, 0}, Message: "upstream: " + err.Error()}
	}
	f.mu.Lock()
	f.stored++
	f.byIntent[intent]++
	if hold > 0 {
		f.lateStores[id]++
	}
	f.mu.Unlock()
	switch fault {
	case SMTPDrop:
		_ = s.conn.Close()
		return errDropped
	case SMTPReset:
		_, _ = s.conn.Write([]byte("250 2.0"))
		if tc, ok := s.conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close with a reset
		}
		_ = s.conn.Close()
		return errDropped
	}
	return nil
}

func (s *frontSession) Reset() { s.from, s.to = "", nil }

func (s *frontSession) Logout() error { return nil }
