package email

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"net/mail"
	"strconv"
	"strings"
	"time"

	gomail "github.com/wneessen/go-mail"
)

// Header names the adapter sets on every message.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderIntentID       = "X-Fencegate-Intent-Id"
	HeaderEpoch          = "X-Fencegate-Epoch"
)

// MessageID returns the Message-ID, angle brackets included, for an
// idempotency key: "<" + the first 26 characters of the unpadded base32 of
// SHA-256(key) + "@" + domain + ">". The same key always gives the same
// Message-ID; 26 base32 characters carry 130 bits, so distinct keys do not
// collide in practice. An empty domain means DefaultDomain.
func MessageID(key, domain string) string {
	if domain == "" {
		domain = DefaultDomain
	}
	sum := sha256.Sum256([]byte(key))
	enc := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:])
	return "<" + enc[:26] + "@" + domain + ">"
}

// addrList is a payload address field: one address or an array of them.
type addrList []string

func (l *addrList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = addrList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("must be an address or an array of addresses")
	}
	*l = many
	return nil
}

// payload is an email intent's payload (outbox validates it on enqueue;
// it is parsed again here because the adapter must not trust a row blindly).
type payload struct {
	To      addrList `json:"to"`
	Cc      addrList `json:"cc"`
	Bcc     addrList `json:"bcc"`
	From    string   `json:"from"`
	Subject string   `json:"subject"`
	Text    string   `json:"text"`
	HTML    string   `json:"html"`
}

// envelope is what goes into MAIL FROM and RCPT TO.
type envelope struct {
	From       string
	Recipients []string
}

func parsePayload(raw json.RawMessage) (payload, envelope, error) {
	var p payload
	if err := json.Unmarshal(raw, &p); err != nil {
		return p, envelope{}, fmt.Errorf("decode payload: %w", err)
	}
	if len(p.To) == 0 {
		return p, envelope{}, errors.New("payload.to: at least one address is required")
	}
	if p.From == "" {
		return p, envelope{}, errors.New("payload.from: is required")
	}
	if p.Text == "" && p.HTML == "" {
		return p, envelope{}, errors.New("payload.text: text or html is required")
	}
	if strings.ContainsAny(p.Subject, "\r\n") {
		return p, envelope{}, errors.New("payload.subject: must be one line")
	}
	from, err := bareAddress("from", p.From)
	if err != nil {
		return p, envelope{}, err
	}
	env := envelope{From: from}
	seen := map[string]bool{}
	for _, f := range []struct {
		name string
		list addrList
	}{{"to", p.To}, {"cc", p.Cc}, {"bcc", p.Bcc}} {
		for i, a := range f.list {
			addr, err := bareAddress(fmt.Sprintf("%s[%d]", f.name, i), a)
			if err != nil {
				return p, envelope{}, err
			}
			// One RCPT per mailbox: a duplicate would make some servers
			// deliver twice.
			if k := strings.ToLower(addr); !seen[k] {
				seen[k] = true
				env.Recipients = append(env.Recipients, addr)
			}
		}
	}
	return p, env, nil
}

func bareAddress(field, s string) (string, error) {
	a, err := mail.ParseAddress(s)
	if err != nil {
		return "", fmt.Errorf("payload.%s: %q is not a valid email address: %w", field, s, err)
	}
	if strings.ContainsAny(a.Address, "\r\n<>") || !strings.Contains(a.Address, "@") {
		return "", fmt.Errorf("payload.%s: %q is not a valid email address", field, s)
	}
	return a.Address, nil
}

// compose renders the message. Bcc recipients go in the envelope only.
func compose(p payload, req headerInfo) ([]byte, error) {
	m := gomail.NewMsg(gomail.WithNoDefaultUserAgent())
	if err := m.From(p.From); err != nil {
		return nil, fmt.Errorf("payload.from: %w", err)
	}
	if err := m.To(p.To...); err != nil {
		return nil, fmt.Errorf("payload.to: %w", err)
	}
	if len(p.Cc) > 0 {
		if err := m.Cc(p.Cc...); err != nil {
			return nil, fmt.Errorf("payload.cc: %w", err)
		}
	}
	m.Subject(p.Subject)
	m.SetDateWithValue(req.Date)
	// go-mail adds the angle brackets itself.
	m.SetMessageIDWithValue(strings.Trim(req.MessageID, "<>"))
	m.SetGenHeader(gomail.Header(HeaderIdempotencyKey), req.Key)
	m.SetGenHeader(gomail.Header(HeaderIntentID), strconv.FormatInt(req.IntentID, 10))
	m.SetGenHeader(gomail.Header(HeaderEpoch), strconv.FormatInt(req.Epoch, 10))
	switch {
	case p.Text != "" && p.HTML != "":
		m.SetBodyString(gomail.TypeTextPlain, p.Text)
		m.AddAlternativeString(gomail.TypeTextHTML, p.HTML)
	case p.Text != "":
		m.SetBodyString(gomail.TypeTextPlain, p.Text)
	default:
		m.SetBodyString(gomail.TypeTextHTML, p.HTML)
	}
	var buf bytes.Buffer
	if _, err := m.WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("render message: %w", err)
	}
	return buf.Bytes(), nil
}

type headerInfo struct {
	MessageID string
	Key       string
	IntentID  int64
	Epoch     int64
	Date      time.Time
}
