package email

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/kinds/emailkind"
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

// envelope is what goes into MAIL FROM and RCPT TO.
type envelope struct {
	From       string
	Recipients []string
}

// parsePayload parses raw with emailkind.Parse, the rules the outbox
// checked at enqueue: the adapter checks them again because it must not
// trust a row blindly (an intent stored by an older version, or by hand).
func parsePayload(raw json.RawMessage) (emailkind.Payload, envelope, error) {
	p, err := emailkind.Parse(raw)
	if err != nil {
		return p, envelope{}, err
	}
	from, rcpts := p.Envelope()
	return p, envelope{From: from, Recipients: rcpts}, nil
}

// compose renders the message. Bcc recipients go in the envelope only.
func compose(p emailkind.Payload, req headerInfo) ([]byte, error) {
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
