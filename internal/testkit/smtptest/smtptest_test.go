package smtptest_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/smtp"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencegate/fencegate/internal/testkit/smtptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func rawMessage(id string) string {
	return "From: a@example.com\r\nTo: b@example.com\r\nSubject: t\r\n" +
		"Message-ID: " + id + "\r\n\r\nhello\r\n"
}

func sendRaw(addr, id string) error {
	return smtp.SendMail(addr, nil, "a@example.com", []string{"b@example.com"}, []byte(rawMessage(id)))
}

func TestServerRecordsMessages(t *testing.T) {
	t.Parallel()
	s := smtptest.NewServer(t)
	if err := sendRaw(s.Addr, "<one@test>"); err != nil {
		t.Fatal(err)
	}
	msgs := s.Messages()
	if len(msgs) != 1 {
		t.Fatalf("got %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if m.MessageID != "<one@test>" || m.From != "a@example.com" || len(m.To) != 1 || m.To[0] != "b@example.com" {
		t.Errorf("recorded %+v", m)
	}
	if got := s.Count("one@test"); got != 1 {
		t.Errorf("Count(one@test) = %d, want 1", got)
	}
	if got := s.Count("<ne@test>"); got != 0 {
		t.Errorf("Count of a substring = %d, want 0", got)
	}
	found, info, err := s.Find(context.Background(), "<one@test>")
	if err != nil || !found || info["mail_from"] != "a@example.com" {
		t.Errorf("Find = %v, %v, %v", found, info, err)
	}
}

func TestServerFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fault      smtptest.Fault
		wantCode   int  // reply code the client sees, 0 for none
		wantStored bool // whether the server kept the message
	}{
		{smtptest.Fault{At: smtptest.PhaseRcpt, Code: 450}, 450, false},
		{smtptest.Fault{At: smtptest.PhaseRcpt, Code: 550}, 550, false},
		{smtptest.Fault{At: smtptest.PhaseData, Code: 451}, 451, false},
		{smtptest.Fault{At: smtptest.PhaseData, Code: 554}, 554, false},
		{smtptest.Fault{At: smtptest.PhaseRcpt, Drop: true}, 0, false},
		{smtptest.Fault{At: smtptest.PhaseData, Drop: true}, 0, true},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			t.Parallel()
			s := smtptest.NewServer(t)
			s.SetFault(tc.fault)
			err := sendRaw(s.Addr, "<f@test>")
			if err == nil {
				t.Fatal("send succeeded, want an error")
			}
			var te *textproto.Error
			switch {
			case tc.wantCode != 0 && (!errors.As(err, &te) || te.Code != tc.wantCode):
				t.Errorf("err = %v, want reply %d", err, tc.wantCode)
			case tc.wantCode == 0 && errors.As(err, &te):
				t.Errorf("err = %v, want a dropped connection", err)
			}
			if got := s.Count("<f@test>"); got != map[bool]int{true: 1}[tc.wantStored] {
				t.Errorf("stored %d messages, want stored=%v", got, tc.wantStored)
			}
			s.ClearFault()
			if err := sendRaw(s.Addr, "<g@test>"); err != nil {
				t.Errorf("after ClearFault: %v", err)
			}
		})
	}
}

func TestServerHangEndsOnClose(t *testing.T) {
	t.Parallel()
	s := smtptest.NewServer(t)
	s.SetFault(smtptest.Fault{At: smtptest.PhaseData, Hang: true})
	done := make(chan error, 1)
	go func() { done <- sendRaw(s.Addr, "<h@test>") }()
	deadline := time.Now().Add(5 * time.Second)
	for s.Count("<h@test>") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("message never stored")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("client returned %v while the server hangs", err)
	case <-time.After(100 * time.Millisecond):
	}
	s.Close()
	if err := <-done; err == nil {
		t.Fatal("client saw success from a hung server")
	}
}

func TestServerTLSAndAuth(t *testing.T) {
	t.Parallel()
	s := smtptest.NewServer(t, smtptest.WithTLS(), smtptest.WithAuth("u", "p"))
	c, err := smtp.Dial(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ok, _ := c.Extension("STARTTLS"); !ok {
		t.Fatal("STARTTLS not offered")
	}
	if err := c.StartTLS(tlsSkipVerify()); err != nil {
		t.Fatal(err)
	}
	if err := c.Auth(smtp.PlainAuth("", "u", "p", "127.0.0.1")); err != nil {
		t.Fatal(err)
	}
	w, err := startData(c, "<tls@test>")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.Quit()
	m := s.Messages()
	if len(m) != 1 || !m[0].TLS || m[0].Username != "u" {
		t.Fatalf("messages = %+v, want one over TLS by u", m)
	}
}

func TestMailpitCountMessageID(t *testing.T) {
	t.Parallel()
	mp := smtptest.StartMailpit(t)
	ctx := context.Background()
	for _, id := range []string{"<dup@count.test>", "<dup@count.test>", "<xdup@count.test>"} {
		if err := sendRaw(mp.SMTPAddr, id); err != nil {
			t.Fatalf("send %s to mailpit: %v", id, err)
		}
	}
	hits, err := smtptest.SearchMessageID(ctx, mp.BaseURL, "<dup@count.test>")
	if err != nil {
		t.Fatal(err)
	}
	if len(hits) != 3 {
		t.Errorf("mailpit search listed %d messages, want 3 (two exact, one substring)", len(hits))
	}
	for id, want := range map[string]int{"<dup@count.test>": 2, "xdup@count.test": 1, "<up@count.test>": 0} {
		got, err := mp.CountMessageID(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("CountMessageID(%s) = %d, want %d", id, got, want)
		}
	}
	if !strings.HasPrefix(mp.BaseURL, "http://127.0.0.1:") {
		t.Errorf("BaseURL = %s", mp.BaseURL)
	}
}

func tlsSkipVerify() *tls.Config { return &tls.Config{InsecureSkipVerify: true} }

// startData sends MAIL, RCPT and DATA on c and writes the message with
// Message-ID id; the writer's Close sends the final dot and waits for the
// reply.
func startData(c *smtp.Client, id string) (io.WriteCloser, error) {
	if err := c.Mail("a@example.com"); err != nil {
		return nil, err
	}
	if err := c.Rcpt("b@example.com"); err != nil {
		return nil, err
	}
	w, err := c.Data()
	if err != nil {
		return nil, err
	}
	if _, err := w.Write([]byte(rawMessage(id))); err != nil {
		return nil, err
	}
	return w, nil
}

// sendWithin sends one message to addr and gives up on the reply to the
// end of data after timeout, like the email adapter's execute timeout.
func sendWithin(addr, id string, timeout time.Duration) error {
	c, err := smtp.Dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	w, err := startData(c, id)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- w.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return errors.New("no reply before the deadline")
	}
}

// The front relays a message it picks only after its delay: the sender's
// deadline passes without a reply, and the message still arrives upstream.
// Other messages are upstream before the front answers.
func TestFrontStoresLate(t *testing.T) {
	t.Parallel()
	up := smtptest.NewServer(t)
	const hold = 400 * time.Millisecond
	f := smtptest.NewFront(t, up.Addr, func(id string, n int) time.Duration {
		if id == "<late@test>" && n == 0 {
			return hold
		}
		return 0
	})
	if err := sendWithin(f.Addr, "<late@test>", 100*time.Millisecond); err == nil {
		t.Fatal("the late message was answered before the sender's deadline")
	}
	if n := up.Count("<late@test>"); n != 0 {
		t.Fatalf("upstream has %d copies right after the deadline, want 0 (stored late)", n)
	}
	if !f.Wait(10 * time.Second) {
		t.Fatal("the held message was never relayed")
	}
	if n := up.Count("<late@test>"); n != 1 {
		t.Fatalf("upstream has %d copies after the hold, want 1", n)
	}
	if got := f.LateStores()["<late@test>"]; got != 1 {
		t.Fatalf("LateStores = %d, want 1", got)
	}
	// The second arrival of the same id and another message go through.
	for _, id := range []string{"<late@test>", "<now@test>"} {
		if err := sendRaw(f.Addr, id); err != nil {
			t.Fatal(err)
		}
		if n := up.Count(id); n == 0 {
			t.Fatalf("%s: answered before it was upstream", id)
		}
	}
	f.Close()
}

// StoreAfter: the server has the whole message, takes it only after the
// delay — forwarding it to its upstream — and only then replies; a client
// that gave up earlier never learns that it was taken.
func TestServerStoresLateAndForwards(t *testing.T) {
	t.Parallel()
	upstream := smtptest.NewServer(t)
	front := smtptest.NewServer(t, smtptest.WithUpstream(upstream.Addr))
	const delay = 300 * time.Millisecond
	front.SetFault(smtptest.Fault{At: smtptest.PhaseData, StoreAfter: delay})
	start := time.Now()
	if err := sendRaw(front.Addr, "<late@test>"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < delay {
		t.Fatalf("the reply came after %s; want no sooner than the store delay %s", took, delay)
	}
	if front.Count("late@test") != 1 || upstream.Count("late@test") != 1 || front.Pending() != 0 {
		t.Fatalf("front %d, upstream %d, pending %d; want the message at both, none pending",
			front.Count("late@test"), upstream.Count("late@test"), front.Pending())
	}

	// A client that gives up before the delay: the message is taken anyway.
	c, err := smtp.Dial(front.Addr)
	if err != nil {
		t.Fatal(err)
	}
	w, err := startData(c, "<abandoned@test>")
	if err != nil {
		t.Fatal(err)
	}
	// Close sends the final dot and waits for the reply; give up at once
	// instead by closing the connection right after the dot is out.
	go func() { _ = w.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for front.Pending() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the front never got the message")
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = c.Close()
	for front.Pending() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the delayed store never happened")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if upstream.Count("abandoned@test") != 1 {
		t.Fatalf("upstream has %d copies of the abandoned message; want 1", upstream.Count("abandoned@test"))
	}
}
