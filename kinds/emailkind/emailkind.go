// Package emailkind is the email kind's payload: its typed form and its one
// set of rules, used by the outbox when an intent is enqueued
// (outbox.DefaultKinds) and by the email adapter when it is executed, so the
// two can never disagree about what a valid email intent is.
//
// It is a leaf package (it imports neither outbox nor adapters), so that
// the outbox can register the kind without importing the adapter.
package emailkind

import (
	"encoding/json"
	"fmt"
	"net/mail"
	"strings"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/kindcheck"
)

// Name is the kind's name.
const Name = "email"

// Payload is an email intent's payload. In JSON each address field is one
// address or an array of them; an address may carry a display name
// ("Ops <ops@example.com>").
type Payload struct {
	To      []string `json:"to"`
	Cc      []string `json:"cc,omitempty"`
	Bcc     []string `json:"bcc,omitempty"`
	From    string   `json:"from"`
	Subject string   `json:"subject"`
	// Text and HTML are the bodies; at least one is required.
	Text string `json:"text,omitempty"`
	HTML string `json:"html,omitempty"`
}

// fields are the payload's fields, spelt exactly: no other is accepted.
var fields = []string{"to", "cc", "bcc", "from", "subject", "text", "html"}

// Parse decodes raw and validates it. Every error is a
// *fenceerr.InvalidError naming the field ("payload.to[1]"); a field that
// is not one of the payload's, spelt exactly ("Bcc", "reply_to"), is
// refused naming it, so that no recipient is silently dropped. On an
// error, the Payload holds what was decoded before it.
func Parse(raw json.RawMessage) (Payload, error) {
	var p Payload
	obj, err := kindcheck.Fields(raw, "an email", fields)
	if err != nil {
		return p, err
	}
	for _, f := range []struct {
		name string
		dst  *[]string
	}{{"to", &p.To}, {"cc", &p.Cc}, {"bcc", &p.Bcc}} {
		if *f.dst, err = kindcheck.Strings(obj, f.name, "an address"); err != nil {
			return p, err
		}
	}
	if err := kindcheck.ReadStrings(obj, kindcheck.Field{Name: "from", Dst: &p.From}, kindcheck.Field{Name: "subject", Dst: &p.Subject},
		kindcheck.Field{Name: "text", Dst: &p.Text}, kindcheck.Field{Name: "html", Dst: &p.HTML}); err != nil {
		return p, err
	}
	return p, p.Validate()
}

// Validate checks p: at least one To address, every address valid, a From
// address, a one-line Subject, a Text or HTML body. The error is a
// *fenceerr.InvalidError naming the field.
func (p Payload) Validate() error {
	if len(p.To) == 0 {
		return fenceerr.Invalid("payload.to", "is required (at least one address)")
	}
	for _, f := range []struct {
		name string
		list []string
	}{{"to", p.To}, {"cc", p.Cc}, {"bcc", p.Bcc}} {
		for i, a := range f.list {
			if _, err := Address(a); err != nil {
				return fenceerr.Invalid(fmt.Sprintf("payload.%s[%d]", f.name, i), "%q is not a valid email address", a)
			}
		}
	}
	if strings.TrimSpace(p.From) == "" {
		return fenceerr.Invalid("payload.from", "is required")
	}
	if _, err := Address(p.From); err != nil {
		return fenceerr.Invalid("payload.from", "%q is not a valid email address", p.From)
	}
	if strings.TrimSpace(p.Subject) == "" {
		return fenceerr.Invalid("payload.subject", "is required")
	}
	if strings.ContainsAny(p.Subject, "\r\n") {
		return fenceerr.Invalid("payload.subject", "must be one line")
	}
	if p.Text == "" && p.HTML == "" {
		return fenceerr.Invalid("payload.text", "text or html is required")
	}
	return nil
}

// Address returns the bare address (local@domain) of s, an address with or
// without a display name, or an error when s is not one valid address.
func Address(s string) (string, error) {
	a, err := mail.ParseAddress(s)
	if err != nil {
		return "", err
	}
	at := strings.LastIndexByte(a.Address, '@')
	if at <= 0 || at == len(a.Address)-1 || strings.ContainsAny(a.Address, "\r\n<>") {
		return "", fmt.Errorf("%q is not a valid email address", s)
	}
	return a.Address, nil
}

// Envelope returns p's SMTP envelope: the bare From address and each
// recipient's bare address (To, Cc, Bcc) once, in order; a mailbox given
// twice, in any case, is one recipient, since a duplicate RCPT makes some
// servers deliver twice. p must be valid (Validate).
func (p Payload) Envelope() (from string, recipients []string) {
	from, _ = Address(p.From)
	seen := map[string]bool{}
	for _, list := range [][]string{p.To, p.Cc, p.Bcc} {
		for _, a := range list {
			addr, err := Address(a)
			if err != nil {
				continue
			}
			if k := strings.ToLower(addr); !seen[k] {
				seen[k] = true
				recipients = append(recipients, addr)
			}
		}
	}
	return from, recipients
}
