package email_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/smtp"
	"net/textproto"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/smtptest"
	"github.com/fencegate/fencegate/outbox"
)

var keySeq atomic.Int64

// uniqueKey returns an idempotency key no other test uses, so tests can
// share nothing and still run in parallel.
func uniqueKey(t *testing.T) string {
	return fmt.Sprintf("%s/%d/%d", t.Name(), time.Now().UnixNano(), keySeq.Add(1))
}

func request(key string, payload map[string]any) adapters.Request {
	if payload == nil {
		payload = map[string]any{
			"to":      []string{"Alice <alice@example.com>", "bob@example.com"},
			"cc":      "carol@example.com",
			"bcc":     []string{"dave@example.com"},
			"from":    "Fencegate <gate@example.com>",
			"subject": "Nightly report ✓",
			"text":    "hello\n.a line starting with a dot\n",
			"html":    "<p>hello</p>",
		}
	}
	b, err := json.Marshal(payload)
	if err != nil {
		panic(err)
	}
	return adapters.Request{
		IntentID:       42,
		Resource:       "report/nightly",
		Epoch:          34,
		Kind:           "email",
		IdempotencyKey: key,
		Fence:          outbox.FenceCommit,
		Payload:        b,
		Attempt:        1,
	}
}

// newAdapter is an adapter for cfg; with no FromAllow, any From (the
// tests' servers deliver nowhere).
func newAdapter(t *testing.T, cfg email.Config) *email.Adapter {
	t.Helper()
	cfg.Policy.AnyFrom = len(cfg.Policy.FromAllow) == 0
	a, err := email.New(cfg)
	if err != nil {
		t.Fatalf("email.New: %v", err)
	}
	return a
}

// newMailpitAdapter is an adapter sending to addr (mp, or a server in
// front of it) with mp's result lookup. Its HTTP client keeps no
// connections alive, so goleak sees no idle ones.
func newMailpitAdapter(t *testing.T, mp *smtptest.Mailpit, addr string, timeout time.Duration) *email.Adapter {
	t.Helper()
	return newAdapter(t, email.Config{
		Addr:    addr,
		Timeout: timeout,
		Lookup: &email.MailpitLookup{BaseURL: mp.BaseURL,
			Client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}},
	})
}

// decodeResult decodes an outcome's or a record's result.
func decodeResult(t *testing.T, res json.RawMessage) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(res, &m); err != nil {
		t.Fatalf("result %s: %v", res, err)
	}
	return m
}

func TestMessageID(t *testing.T) {
	t.Parallel()
	a := email.MessageID("report/2026-12-01/alice", "")
	if b := email.MessageID("report/2026-12-01/alice", ""); a != b {
		t.Errorf("same key gave %s and %s", a, b)
	}
	if b := email.MessageID("report/2026-12-01/bob", ""); a == b {
		t.Errorf("different keys gave the same id %s", a)
	}
	if !regexp.MustCompile(`^<[A-Z2-7]{26}@fencegate\.local>$`).MatchString(a) {
		t.Errorf("MessageID = %q, want <26 base32 chars@fencegate.local>", a)
	}
	if got := email.MessageID("k", "mail.example.com"); !strings.HasSuffix(got, "@mail.example.com>") {
		t.Errorf("MessageID with domain = %q", got)
	}
	// Pinned: the id is stored in results and searched for later, so it
	// must not change between versions.
	if got, want := email.MessageID("k", ""), "<"+pinnedK+"@fencegate.local>"; got != want {
		t.Errorf("MessageID(k) = %s, want %s", got, want)
	}
}

// pinnedK is the base32 of SHA-256("k"), first 26 characters.
const pinnedK = "QJKMGKNJFBIPNVJZ3U3W6SAW5Y"

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	anyFrom := email.Policy{AnyFrom: true}
	for _, tc := range []struct {
		name string
		cfg  email.Config
		// field is the field the error names; "": valid.
		field string
	}{
		{"defaults", email.Config{Addr: "127.0.0.1:25", Policy: anyFrom}, ""},
		{"no addr", email.Config{Policy: anyFrom}, "Addr"},
		{"no port", email.Config{Addr: "mail.example.com", Policy: anyFrom}, "Addr"},
		{"bad starttls", email.Config{Addr: "h:25", StartTLS: "always", Policy: anyFrom}, "StartTLS"},
		{"password without user", email.Config{Addr: "h:25", Password: "p", Policy: anyFrom}, "Password"},
		{"bad domain", email.Config{Addr: "h:25", Domain: "a@b", Policy: anyFrom}, "Domain"},
		{"bad local name", email.Config{Addr: "h:25", LocalName: "a b", Policy: anyFrom}, "LocalName"},
		{"negative timeout", email.Config{Addr: "h:25", Timeout: -time.Second, Policy: anyFrom}, "Timeout"},
		{"negative settle", email.Config{Addr: "h:25", LookupSettle: -time.Second, Policy: anyFrom}, "LookupSettle"},
		{"no sessions", email.Config{Addr: "h:25", MaxSessions: -1, Policy: anyFrom}, "MaxSessions"},
		{"mailpit without a URL", email.Config{Addr: "h:25", Lookup: &email.MailpitLookup{}, Policy: anyFrom}, "Lookup.BaseURL"},
		{"mailpit URL", email.Config{Addr: "h:25", Lookup: &email.MailpitLookup{BaseURL: "http://127.0.0.1:8025"}, Policy: anyFrom}, ""},
		{"bad sender", email.Config{Addr: "h:25", Policy: email.Policy{FromAllow: []string{"a b"}}}, "Policy.FromAllow"},
		{"no sender allow-list", email.Config{Addr: "h:25"}, "Policy.FromAllow"},
		{"a sender allow-list", email.Config{Addr: "h:25", Policy: email.Policy{FromAllow: []string{"example.com"}}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, err := range []error{tc.cfg.Validate(), func() error { _, err := email.New(tc.cfg); return err }()} {
				var inv *fenceerr.InvalidError
				if tc.field == "" && err != nil || tc.field != "" && (!errors.As(err, &inv) || inv.Field != tc.field) {
					t.Errorf("%+v: %v, want an InvalidError naming %q", tc.cfg, err, tc.field)
				}
			}
		})
	}
	d := email.Config{}.WithDefaults()
	if d.Domain != "fencegate.local" || d.Timeout != 30*time.Second || d.StartTLS != "opportunistic" {
		t.Errorf("defaults = %+v", d)
	}
}

// A refused Mailpit URL is not echoed: it may carry a password
// (http://user:password@host, Mailpit's basic auth). It was quoted whole
// ("got \"ftp://u:<password>@h:1\""). One with a query or fragment is
// refused too: the lookup appends its path and query to it.
func TestMailpitURLNotEchoed(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"ftp://u:PWsecret@h:1", "http://u:PWsecret%zz@h:8025", "http://u:PWsecret@", "http://u:PWsecret@h:8025/?token=x", "http://u:PWsecret@h:8025/#x"} {
		err := email.Config{Addr: "h:25", Lookup: &email.MailpitLookup{BaseURL: u}, Policy: email.Policy{AnyFrom: true}}.Validate()
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != "Lookup.BaseURL" {
			t.Errorf("BaseURL %q: %v, want an InvalidError naming Lookup.BaseURL", u, err)
		}
		if err != nil && strings.Contains(err.Error(), "PWsecret") {
			t.Errorf("BaseURL %q: the error shows its password: %v", u, err)
		}
	}
	// Basic auth in the user info is Mailpit's own: accepted.
	if err := (email.Config{Addr: "h:25", Lookup: &email.MailpitLookup{BaseURL: "https://u:p@mailpit.example:8025/mailpit"}, Policy: email.Policy{AnyFrom: true}}).Validate(); err != nil {
		t.Errorf("a URL with user info and a path: %v", err)
	}
}

// TestMailpitSendAndLookup sends through a real Mailpit and finds the
// message again by its exact Message-ID, while a decoy whose Message-ID
// contains the searched id is not taken for it.
func TestMailpitSendAndLookup(t *testing.T) {
	t.Parallel()
	mp := smtptest.StartMailpit(t)
	ctx := context.Background()
	a := newMailpitAdapter(t, mp, mp.SMTPAddr, 0)
	if c := a.Capabilities(); !c.Lookup || c.DedupsOnKey {
		t.Fatalf("Capabilities = %+v, want Lookup, not DedupsOnKey", c)
	}

	key := uniqueKey(t)
	req := request(key, nil)
	out, err := a.Execute(ctx, req)
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if out.Status != outbox.StatusSucceeded {
		t.Errorf("status = %s", out.Status)
	}
	res := decodeResult(t, out.Result)
	id := email.MessageID(key, "")
	if res["message_id"] != id {
		t.Errorf("result message_id = %v, want %s", res["message_id"], id)
	}
	if resp, _ := res["smtp_response"].(string); !strings.HasPrefix(resp, "250 ") || !strings.Contains(resp, "queued") {
		t.Errorf("smtp_response = %q, want Mailpit's 250 … queued as …", resp)
	}
	if rc, _ := res["recipients"].([]any); len(rc) != 4 {
		t.Errorf("recipients = %v, want to+cc+bcc (4)", res["recipients"])
	}
	if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(res["sent_at"])); err != nil {
		t.Errorf("sent_at = %v: %v", res["sent_at"], err)
	}

	got, found, err := a.Lookup(ctx, req)
	if err != nil || !found {
		t.Fatalf("Lookup = %v, %v; want found", found, err)
	}
	lres := decodeResult(t, got.Result)
	if lres["message_id"] != id || lres["found_by"] != "lookup" || lres["mailpit_id"] == "" {
		t.Errorf("lookup result = %v", lres)
	}

	// The decoy's Message-ID contains the id of a key never sent, so
	// Mailpit's substring search returns it; the lookup must not.
	missing := request(uniqueKey(t), nil)
	bare := strings.Trim(email.MessageID(missing.IdempotencyKey, ""), "<>")
	decoy := "<x" + bare + ">"
	msg := "From: gate@example.com\r\nTo: alice@example.com\r\nSubject: decoy\r\nMessage-ID: " + decoy + "\r\n\r\ndecoy\r\n"
	if err := smtp.SendMail(mp.SMTPAddr, nil, "gate@example.com", []string{"alice@example.com"}, []byte(msg)); err != nil {
		t.Fatalf("send decoy: %v", err)
	}
	hits, err := smtptest.SearchMessageID(ctx, mp.BaseURL, bare)
	if err != nil || len(hits) != 1 {
		t.Fatalf("Mailpit search for %s = %v, %v; want the decoy as a substring hit", bare, hits, err)
	}
	if _, found, err := a.Lookup(ctx, missing); err != nil || found {
		t.Errorf("Lookup of a never-sent key = found %v, %v; want not found despite the decoy", found, err)
	}
}

// TestMailpitSameKeyTwice shows that Mailpit does not dedup: the same key
// sent twice is two messages with one Message-ID. That is why DedupsOnKey
// defaults to false and an unknown outcome is looked up, not re-sent.
func TestMailpitSameKeyTwice(t *testing.T) {
	t.Parallel()
	mp := smtptest.StartMailpit(t)
	ctx := context.Background()
	a := newAdapter(t, email.Config{Addr: mp.SMTPAddr})
	key := uniqueKey(t)
	var ids []any
	for range 2 {
		out, err := a.Execute(ctx, request(key, nil))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, decodeResult(t, out.Result)["message_id"])
	}
	if ids[0] != ids[1] {
		t.Errorf("same key gave Message-IDs %v and %v", ids[0], ids[1])
	}
	n, err := mp.CountMessageID(ctx, email.MessageID(key, ""))
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("Mailpit holds %d messages with the id, want 2", n)
	}
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	s := smtptest.NewServer(t)
	a := newAdapter(t, email.Config{Addr: s.Addr, Domain: "mail.example.com"})
	key := "resource/op-1\r\nBcc: evil@example.com" // must not inject a header
	if _, err := a.Execute(context.Background(), request(key, nil)); err != nil {
		t.Fatal(err)
	}
	msgs := s.Messages()
	if len(msgs) != 1 {
		t.Fatalf("server has %d messages", len(msgs))
	}
	m := msgs[0]
	h, err := m.Header()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.Get("Message-ID"), email.MessageID(key, "mail.example.com"); got != want || m.MessageID != want {
		t.Errorf("Message-ID = %q, want %q", got, want)
	}
	var dec mime.WordDecoder
	if got, _ := dec.DecodeHeader(h.Get("Idempotency-Key")); got != key {
		t.Errorf("Idempotency-Key = %q (raw %q), want %q", got, h.Get("Idempotency-Key"), key)
	}
	if h.Get("X-Fencegate-Intent-Id") != "42" || h.Get("X-Fencegate-Epoch") != "34" {
		t.Errorf("X-Fencegate headers = %q, %q", h.Get("X-Fencegate-Intent-Id"), h.Get("X-Fencegate-Epoch"))
	}
	if h.Get("Bcc") != "" || strings.Contains(string(m.Data), "dave@example.com") {
		t.Error("Bcc recipient leaked into the message")
	}
	want := []string{"alice@example.com", "bob@example.com", "carol@example.com", "dave@example.com"}
	if strings.Join(m.To, ",") != strings.Join(want, ",") || m.From != "gate@example.com" {
		t.Errorf("envelope from %s to %v, want gate@example.com to %v", m.From, m.To, want)
	}
}

// phaseOf returns the SMTP phase and reply code err carries.
func phaseOf(t *testing.T, err error) (email.Phase, int) {
	t.Helper()
	var pe *email.PhaseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v carries no *email.PhaseError", err)
	}
	return pe.Phase, pe.Code
}

type class int

const (
	permanent class = iota
	retryable
	unknown
)

func (c class) String() string { return [...]string{"permanent", "retryable", "unknown"}[c] }

func classOf(err error) class {
	switch {
	case adapters.IsUnknown(err):
		return unknown
	case adapters.IsRetryable(err):
		return retryable
	}
	return permanent
}

func TestFaultClassification(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fault     smtptest.Fault
		want      class
		phase     email.Phase
		code      int
		delivered bool // the server kept the message
	}{
		{smtptest.Fault{At: smtptest.PhaseRcpt, Code: 450}, retryable, email.PhaseRcpt, 450, false},
		{smtptest.Fault{At: smtptest.PhaseRcpt, Code: 550}, permanent, email.PhaseRcpt, 550, false},
		{smtptest.Fault{At: smtptest.PhaseRcpt, Drop: true}, retryable, email.PhaseRcpt, 0, false},
		{smtptest.Fault{At: smtptest.PhaseData, Code: 451}, retryable, email.PhaseFinalReply, 451, false},
		{smtptest.Fault{At: smtptest.PhaseData, Code: 554}, permanent, email.PhaseFinalReply, 554, false},
		// The server accepted the message and the connection dropped
		// before its 250: the sender cannot know.
		{smtptest.Fault{At: smtptest.PhaseData, Drop: true}, unknown, email.PhaseFinalReply, 0, true},
		// Same, but the reply never comes and the attempt times out.
		{smtptest.Fault{At: smtptest.PhaseData, Hang: true}, unknown, email.PhaseFinalReply, 0, true},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			t.Parallel()
			s := smtptest.NewServer(t)
			s.SetFault(tc.fault)
			cfg := email.Config{Addr: s.Addr, Lookup: s}
			if tc.fault.Hang {
				cfg.Timeout = time.Second // the attempt's bound is what ends it
			}
			a := newAdapter(t, cfg)
			req := request(uniqueKey(t), nil)
			out, err := a.Execute(context.Background(), req)
			if err == nil {
				t.Fatalf("Execute succeeded (%s), want %s", out.Result, tc.want)
			}
			if got := classOf(err); got != tc.want {
				t.Errorf("class = %s, want %s (err %v)", got, tc.want, err)
			}
			if phase, code := phaseOf(t, err); phase != tc.phase || code != tc.code {
				t.Errorf("phase, code = %s, %d; want %s, %d (err %v)", phase, code, tc.phase, tc.code, err)
			}
			// Result lookup settles what the error could not.
			lout, found, lerr := a.Lookup(context.Background(), req)
			if lerr != nil || found != tc.delivered {
				t.Fatalf("Lookup = found %v, %v; want found %v", found, lerr, tc.delivered)
			}
			if found {
				res := decodeResult(t, lout.Result)
				if res["found_by"] != "lookup" || res["message_id"] != email.MessageID(req.IdempotencyKey, "") ||
					lout.Status != outbox.StatusSucceeded {
					t.Errorf("lookup outcome = %s %v", lout.Status, res)
				}
			}
		})
	}
}

func TestDialFailureIsRetryable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	a := newAdapter(t, email.Config{Addr: addr})
	_, err = a.Execute(context.Background(), request(uniqueKey(t), nil))
	if classOf(err) != retryable {
		t.Fatalf("err = %v, want retryable", err)
	}
	if phase, _ := phaseOf(t, err); phase != email.PhaseDial {
		t.Errorf("phase = %s, want dial", phase)
	}
}

// TestCancelledContextIsRetryable: a context cancelled while the
// transaction is still before DATA leaves nothing sent.
func TestCancelledContextIsRetryable(t *testing.T) {
	t.Parallel()
	s := smtptest.NewServer(t)
	s.SetFault(smtptest.Fault{At: smtptest.PhaseRcpt, Hang: true})
	a := newAdapter(t, email.Config{Addr: s.Addr})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := a.Execute(ctx, request(uniqueKey(t), nil))
	if classOf(err) != retryable {
		t.Fatalf("err = %v, want retryable", err)
	}
	if phase, _ := phaseOf(t, err); phase != email.PhaseRcpt {
		t.Errorf("phase = %s, want rcpt", phase)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want it to wrap context.DeadlineExceeded", err)
	}
}

func TestStartTLSAndAuth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tlsAuth := smtptest.NewServer(t, smtptest.WithTLS(), smtptest.WithAuth("user", "secret"))
	plain := smtptest.NewServer(t)

	t.Run("required over TLS with auth", func(t *testing.T) {
		a := newAdapter(t, email.Config{Addr: tlsAuth.Addr, StartTLS: "required",
			InsecureSkipVerify: true, Username: "user", Password: "secret"})
		if _, err := a.Execute(ctx, request(uniqueKey(t), nil)); err != nil {
			t.Fatal(err)
		}
		m := tlsAuth.Messages()
		if len(m) == 0 || !m[len(m)-1].TLS || m[len(m)-1].Username != "user" {
			t.Errorf("message not sent over TLS as user: %+v", m)
		}
	})
	t.Run("wrong password is permanent", func(t *testing.T) {
		a := newAdapter(t, email.Config{Addr: tlsAuth.Addr, StartTLS: "required",
			InsecureSkipVerify: true, Username: "user", Password: "wrong"})
		_, err := a.Execute(ctx, request(uniqueKey(t), nil))
		if classOf(err) != permanent {
			t.Fatalf("err = %v, want permanent", err)
		}
		if phase, code := phaseOf(t, err); phase != email.PhaseAuth || code != 535 {
			t.Errorf("phase, code = %s, %d; want auth, 535", phase, code)
		}
	})
	t.Run("untrusted certificate is retryable", func(t *testing.T) {
		a := newAdapter(t, email.Config{Addr: tlsAuth.Addr, StartTLS: "opportunistic"})
		_, err := a.Execute(ctx, request(uniqueKey(t), nil))
		if classOf(err) != retryable {
			t.Fatalf("err = %v, want retryable", err)
		}
		if phase, _ := phaseOf(t, err); phase != email.PhaseStartTLS {
			t.Errorf("phase = %s, want starttls", phase)
		}
	})
	t.Run("required but not offered is permanent", func(t *testing.T) {
		a := newAdapter(t, email.Config{Addr: plain.Addr, StartTLS: "required"})
		_, err := a.Execute(ctx, request(uniqueKey(t), nil))
		if classOf(err) != permanent {
			t.Fatalf("err = %v, want permanent", err)
		}
		if len(plain.Messages()) != 0 {
			t.Error("message sent in clear text")
		}
	})
	t.Run("opportunistic without offer sends in clear", func(t *testing.T) {
		a := newAdapter(t, email.Config{Addr: plain.Addr})
		if _, err := a.Execute(ctx, request(uniqueKey(t), nil)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestBadPayloadIsPermanent(t *testing.T) {
	t.Parallel()
	s := smtptest.NewServer(t)
	a := newAdapter(t, email.Config{Addr: s.Addr})
	for name, p := range map[string]map[string]any{
		"no to":      {"from": "a@example.com", "subject": "s", "text": "t"},
		"bad to":     {"to": "not an address", "from": "a@example.com", "subject": "s", "text": "t"},
		"no from":    {"to": "b@example.com", "subject": "s", "text": "t"},
		"no body":    {"to": "b@example.com", "from": "a@example.com", "subject": "s"},
		"to type":    {"to": 7, "from": "a@example.com", "subject": "s", "text": "t"},
		"subject nl": {"to": "b@example.com", "from": "a@example.com", "subject": "a\r\nBcc: x@y.z", "text": "t"},
	} {
		_, err := a.Execute(context.Background(), request(uniqueKey(t), p))
		if err == nil || classOf(err) != permanent {
			t.Errorf("%s: err = %v, want permanent", name, err)
		}
	}
	if n := len(s.Messages()); n != 0 {
		t.Errorf("server got %d messages from bad payloads", n)
	}
}

func TestLookupUnavailable(t *testing.T) {
	t.Parallel()
	a := newAdapter(t, email.Config{Addr: "127.0.0.1:25"})
	if a.Capabilities().Lookup {
		t.Error("Capabilities().Lookup = true without a Lookup")
	}
	_, _, err := a.Lookup(context.Background(), request("k", nil))
	if !errors.Is(err, email.ErrLookupUnavailable) {
		t.Errorf("Lookup err = %v, want ErrLookupUnavailable", err)
	}
	if a.Kind() != "email" {
		t.Errorf("Kind = %q", a.Kind())
	}
}

// echoAuthServer is an SMTP server on loopback that answers AUTH with
// reply, in which %s is the AUTH command it got (some servers echo the
// command they refuse), and closes the session.
func echoAuthServer(t *testing.T, reply string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := textproto.NewConn(c)
				tc.PrintfLine("220 echo ESMTP")
				for {
					line, err := tc.ReadLine()
					if err != nil {
						return
					}
					switch {
					case strings.HasPrefix(strings.ToUpper(line), "EHLO"):
						tc.PrintfLine("250-echo\r\n250 AUTH PLAIN")
					case strings.HasPrefix(strings.ToUpper(line), "AUTH"):
						tc.PrintfLine(reply, line)
						return
					default:
						tc.PrintfLine("250 ok")
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A server that echoes the AUTH command in its refusal echoes the
// password, base64-encoded: the error (the intent's last_error, the logs)
// must not carry it, in whole, cut short, or decoded; the reply code and
// the classification stay. The old code recorded the echo as it came.
func TestAuthRefusalDoesNotCarryThePassword(t *testing.T) {
	t.Parallel()
	const user, pass = "alice", "s3cr3t-Pa55word"
	b64 := base64.StdEncoding.EncodeToString([]byte("\x00" + user + "\x00" + pass))
	for _, tc := range []struct {
		reply string
		code  int
		class class
	}{
		{"535 5.7.8 Authentication failed for %s", 535, permanent},
		{"501 5.5.4 Syntax error in parameters: '%s'", 501, permanent},
		{"454 4.7.0 Temporary failure: %.30s", 454, retryable},             // cut short
		{"535 5.7.8 bad \x00alice\x00" + pass + " (%.0s)", 535, permanent}, // decoded
		// The password cut short, and the base64 split over a reply's
		// lines in pieces shorter than any rule could tell from words.
		{"535 5.7.8 password '" + pass[:len(pass)-3] + "...' rejected (%.0s)", 535, permanent},
		{"535-5.7.8 response " + b64[:6] + "\r\n535-5.7.8 " + b64[6:12] + "\r\n535 5.7.8 " + b64[12:18] + " (%.0s)", 535, permanent},
	} {
		t.Run(fmt.Sprint(tc.code), func(t *testing.T) {
			t.Parallel()
			a := newAdapter(t, email.Config{Addr: echoAuthServer(t, tc.reply), StartTLS: email.StartTLSNone,
				Username: user, Password: pass, Timeout: 5 * time.Second})
			_, err := a.Execute(context.Background(), request(uniqueKey(t), nil))
			if classOf(err) != tc.class {
				t.Fatalf("err = %v, want class %v", err, tc.class)
			}
			if phase, code := phaseOf(t, err); phase != email.PhaseAuth || code != tc.code {
				t.Errorf("phase, code = %s, %d; want auth, %d", phase, code, tc.code)
			}
			for _, secret := range []string{pass, b64, b64[:12], pass[:6], b64[:6], b64[6:12], b64[12:18]} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("the error carries the credentials (%q): %v", secret, err)
				}
			}
		})
	}
}

// Review: a refusal that echoes the AUTH response glued to a word
// (response=…, data:…) or a reply line that is no SMTP reply at all (a
// proxy or a broken server echoing the command, read by textproto as a
// ProtocolError) must not carry the password either.
func TestAuthRefusalGluedOrMalformedDoesNotCarryThePassword(t *testing.T) {
	t.Parallel()
	const user, pass = "alice", "s3cr3t-Pa55word"
	b64 := base64.StdEncoding.EncodeToString([]byte("\x00" + user + "\x00" + pass))
	for name, reply := range map[string]string{
		"glued":     "535 5.7.8 rejected initial-response=" + b64 + "%.0s",
		"malformed": "%s",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := newAdapter(t, email.Config{Addr: echoAuthServer(t, reply), StartTLS: email.StartTLSNone,
				Username: user, Password: pass, Timeout: 5 * time.Second})
			_, err := a.Execute(context.Background(), request(uniqueKey(t), nil))
			if err == nil {
				t.Fatal("no error")
			}
			for _, secret := range []string{pass, b64, b64[:12]} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("the error carries the credentials (%q): %v", secret, err)
				}
			}
		})
	}
}
