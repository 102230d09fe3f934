package devsmtp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/smtp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/cli/internal/devsmtp"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T, cfg devsmtp.Config) *devsmtp.Server {
	t.Helper()
	s, err := devsmtp.Start(cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func sendRaw(t *testing.T, addr, from string, to []string, msg string) {
	t.Helper()
	if err := smtp.SendMail(addr, nil, from, to, []byte(strings.ReplaceAll(msg, "\n", "\r\n"))); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// TestDevSMTPAdapterRoundTrip sends through the real email adapter and
// looks the message up through the adapter's result lookup, configured
// with the sink, as `gateway dev` wires them.
func TestDevSMTPAdapterRoundTrip(t *testing.T) {
	s := start(t, devsmtp.Config{})
	a, err := email.New(email.Config{Addr: s.Addr(), StartTLS: email.StartTLSNone, Lookup: s, Policy: email.Policy{AnyFrom: true}})
	if err != nil {
		t.Fatal(err)
	}
	req := adapters.Request{
		IntentID: 7, Resource: "nightly-report", Epoch: 34, Kind: email.Kind,
		IdempotencyKey: "nightly-report/2026-12-01",
		Payload:        json.RawMessage(`{"to":["alice@example.com","bob@example.com"],"from":"reports@example.com","subject":"Nightly report — épreuve","text":"hello"}`),
	}
	ctx := context.Background()

	// Before sending, lookup says "not there".
	if _, found, err := a.Lookup(ctx, req); err != nil || found {
		t.Fatalf("lookup before send: found=%v err=%v", found, err)
	}
	out, err := a.Execute(ctx, req)
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	if out.Status != outbox.StatusSucceeded {
		t.Fatalf("status %s", out.Status)
	}
	out, found, err := a.Lookup(ctx, req)
	if err != nil || !found {
		t.Fatalf("lookup after send: found=%v err=%v", found, err)
	}
	var res map[string]any
	if err := json.Unmarshal(out.Result, &res); err != nil {
		t.Fatal(err)
	}
	if res["message_id"] != a.MessageID(req.IdempotencyKey) || res["copies"] != float64(1) || res["destination"] != "devsmtp" {
		t.Fatalf("lookup result %v", res)
	}

	msgs := s.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if m.Seq != 1 || m.MessageID != a.MessageID(req.IdempotencyKey) || m.From != "reports@example.com" ||
		strings.Join(m.To, ",") != "alice@example.com,bob@example.com" ||
		m.Subject != "Nightly report — épreuve" || m.IdempotencyKey != req.IdempotencyKey ||
		m.IntentID != "7" || m.Epoch != "34" || m.Size != len(m.Data) || m.ReceivedAt.IsZero() {
		t.Fatalf("stored message %+v", m)
	}
	if got, ok := s.Message(1); !ok || got.MessageID != m.MessageID {
		t.Fatalf("Message(1) = %+v, %v", got, ok)
	}
	if _, ok := s.Message(2); ok {
		t.Fatal("Message(2) found")
	}
	h, err := m.Header()
	if err != nil || h.Get(email.HeaderIdempotencyKey) != req.IdempotencyKey {
		t.Fatalf("header: %v %v", h, err)
	}
}

func TestDevSMTPFindIsExact(t *testing.T) {
	s := start(t, devsmtp.Config{})
	sendRaw(t, s.Addr(), "a@example.com", []string{"b@example.com"},
		"Message-ID: <abc@dev.local>\nSubject: one\n\nbody\n")
	sendRaw(t, s.Addr(), "a@example.com", []string{"b@example.com"},
		"Message-ID: <abc@dev.local>\nSubject: again\n\nbody\n")
	sendRaw(t, s.Addr(), "a@example.com", []string{"b@example.com"},
		"Subject: no id\n\nbody\n")

	for _, tc := range []struct {
		id     string
		found  bool
		copies int
	}{
		{"<abc@dev.local>", true, 2},
		{"abc@dev.local", true, 2},
		{" <abc@dev.local> ", true, 2},
		{"<bc@dev.local>", false, 0},
		{"<xabc@dev.local>", false, 0},
		{"<ABC@dev.local>", false, 0},
		{"<abc@dev.local.x>", false, 0},
		{"", false, 0},
		{"<>", false, 0},
	} {
		found, info, err := s.Find(context.Background(), tc.id)
		if err != nil || found != tc.found {
			t.Errorf("Find(%q) = %v, %v; want %v", tc.id, found, err, tc.found)
			continue
		}
		if found && info["copies"] != tc.copies {
			t.Errorf("Find(%q) copies = %v, want %d", tc.id, info["copies"], tc.copies)
		}
		if found && info["seq"] != int64(2) {
			t.Errorf("Find(%q) seq = %v, want the newest (2)", tc.id, info["seq"])
		}
		if n := s.Count(tc.id); n != tc.copies {
			t.Errorf("Count(%q) = %d, want %d", tc.id, n, tc.copies)
		}
	}
	msgs := s.Messages()
	if len(msgs) != 3 || msgs[0].Subject != "no id" || msgs[0].MessageID != "" || msgs[2].Subject != "one" {
		t.Fatalf("messages (newest first): %+v", msgs)
	}
}

func TestDevSMTPKeepsAtMostMaxMessages(t *testing.T) {
	s := start(t, devsmtp.Config{MaxMessages: 2})
	for i := 1; i <= 3; i++ {
		sendRaw(t, s.Addr(), "a@example.com", []string{"b@example.com"},
			fmt.Sprintf("Message-ID: <m%d@dev.local>\nSubject: %d\n\nbody\n", i, i))
	}
	msgs := s.Messages()
	if len(msgs) != 2 || msgs[0].Seq != 3 || msgs[1].Seq != 2 {
		t.Fatalf("messages %+v", msgs)
	}
	if found, _, _ := s.Find(context.Background(), "<m1@dev.local>"); found {
		t.Fatal("dropped message still found")
	}
	if found, _, _ := s.Find(context.Background(), "<m3@dev.local>"); !found {
		t.Fatal("newest message not found")
	}
}

func TestDevSMTPCloseReleasesThePort(t *testing.T) {
	s, err := devsmtp.Start(devsmtp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sendRaw(t, s.Addr(), "a@example.com", []string{"b@example.com"}, "Message-ID: <x@y>\n\nbody\n")
	// An idle client connection must not keep Close waiting.
	idle, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	begin := time.Now()
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Fatalf("close took %s", d)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("port still open after Close")
	}
	if len(s.Messages()) != 1 {
		t.Fatal("messages lost on Close")
	}
}

func TestDevSMTPConfigErrors(t *testing.T) {
	for _, cfg := range []devsmtp.Config{
		{Addr: "nonsense"},
		{MaxMessages: -1},
		{MaxMessageBytes: -1},
	} {
		if s, err := devsmtp.Start(cfg); err == nil {
			_ = s.Close()
			t.Errorf("Start(%+v) succeeded", cfg)
		}
	}
}
