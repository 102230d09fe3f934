package chaos

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	gosmtp "github.com/emersion/go-smtp"

	"github.com/fencegate/fencegate/internal/testkit/smtptest"
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

// SMTPFront is the email destination of the chaos run: an smtptest.Front
// that stores each message by relaying it to a real server (Mailpit)
// before it answers, and misbehaves on the messages armed faults pick.
// Besides, lateHold picks messages to store late, by their Message-ID,
// from the run's seed.
type SMTPFront struct {
	*smtptest.Front
	*faults

	late     time.Duration
	lateHold func(messageID string, n int) time.Duration

	mu  sync.Mutex
	rng *rand.Rand
}

// NewSMTPFront starts a front on a free 127.0.0.1 port relaying to
// upstream (host:port). A late store comes after late (the sender's reply
// deadline); lateHold (may be nil) holds the messages it picks besides.
func NewSMTPFront(seed uint64, upstream string, late time.Duration, lateHold func(messageID string, n int) time.Duration) (*SMTPFront, error) {
	f := &SMTPFront{faults: newFaults(), late: late, lateHold: lateHold, rng: rand.New(rand.NewPCG(seed, 0x5e7d))}
	front, err := smtptest.StartFront(upstream, f.decide)
	if err != nil {
		return nil, err
	}
	f.Front = front
	return f, nil
}

// decide applies the first armed fault to a message, or lateHold's hold.
func (f *SMTPFront) decide(id string, n int) smtptest.FrontAction {
	fault := f.take(SMTPFaults, nil)
	f.mu.Lock()
	defer f.mu.Unlock()
	var act smtptest.FrontAction
	switch {
	case fault == SMTPLate:
		act.Hold = f.late + 100*time.Millisecond + time.Duration(f.rng.IntN(1400))*time.Millisecond
	case fault == "" && f.lateHold != nil:
		act.Hold = f.lateHold(id, n)
	}
	busyCode := 421
	if f.rng.IntN(2) == 0 {
		busyCode = 451
	}
	switch fault {
	case SMTPBusy:
		act.Refuse = &gosmtp.SMTPError{Code: busyCode, EnhancedCode: gosmtp.EnhancedCode{4, 3, 2}, Message: "busy, try again later"}
	case SMTPDrop:
		act.Drop = true
	case SMTPReset:
		act.Reset = true
	}
	return act
}

// StoredByIntent returns, per intent id, the messages stored that its
// attempts sent (the X-Fencegate-Intent-Id of the attempt).
func (f *SMTPFront) StoredByIntent() map[int64]int {
	out := map[int64]int{}
	for _, m := range f.Relayed() {
		intent, _ := strconv.ParseInt(strings.TrimSpace(m.Header.Get("X-Fencegate-Intent-Id")), 10, 64)
		out[intent]++
	}
	return out
}

// Stored is the number of messages stored.
func (f *SMTPFront) Stored() int { return len(f.Relayed()) }
