package email

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/kinds/emailkind"
	"github.com/fencegate/fencegate/outbox"
)

// DefaultMaxRecipients is Policy.MaxRecipients's default.
const DefaultMaxRecipients = 50

// Policy is what the email adapter may send: without one, any caller with
// a worker token could send any From to anyone through the
// organisation's SMTP relay.
type Policy struct {
	// FromAllow lists the allowed From addresses ("reports@example.com",
	// exact, case-insensitive) and domains ("example.com": an address at
	// exactly that domain, not its subdomains). Required (Config.Validate)
	// unless AnyFrom.
	FromAllow []string
	// AnyFrom states that any From is allowed on purpose (gateway dev,
	// whose sink delivers nowhere): with no FromAllow, any From is sent.
	AnyFrom bool
	// RcptAllow lists the allowed recipient domains (To, Cc, Bcc), exact.
	// None: any.
	RcptAllow []string
	// MaxRecipients bounds To+Cc+Bcc after dedup. Default
	// DefaultMaxRecipients.
	MaxRecipients int
	// EnvelopeFrom is the SMTP envelope sender (MAIL FROM), which callers
	// cannot set. Empty: the payload's From.
	EnvelopeFrom string
}

// CheckConfig checks the policy's own entries. An error is a
// *fenceerr.InvalidError naming the field (FromAllow, RcptAllow,
// MaxRecipients, EnvelopeFrom).
func (pol Policy) CheckConfig() error {
	for _, e := range pol.FromAllow {
		if strings.Contains(e, "@") {
			if _, err := emailkind.Address(e); err != nil {
				return fenceerr.Invalid("FromAllow", "%q is not an address", e)
			}
		} else if e == "" || strings.ContainsAny(e, " <>\t") {
			return fenceerr.Invalid("FromAllow", "%q is neither an address nor a domain", e)
		}
	}
	for _, d := range pol.RcptAllow {
		if d == "" || strings.ContainsAny(d, "@ <>\t") {
			return fenceerr.Invalid("RcptAllow", "%q is not a domain", d)
		}
	}
	if pol.MaxRecipients < 0 {
		return fenceerr.Invalid("MaxRecipients", "must be at least 1")
	}
	if pol.EnvelopeFrom != "" {
		if _, err := emailkind.Address(pol.EnvelopeFrom); err != nil {
			return fenceerr.Invalid("EnvelopeFrom", "%q is not an address", pol.EnvelopeFrom)
		}
	}
	return nil
}

func domainOf(addr string) string {
	return strings.ToLower(addr[strings.LastIndexByte(addr, '@')+1:])
}

// Check checks a valid payload against the policy; the error is a
// *fenceerr.InvalidError naming the payload's field.
func (pol Policy) Check(p emailkind.Payload) error {
	if len(pol.FromAllow) > 0 {
		from, _ := emailkind.Address(p.From)
		ok := false
		for _, e := range pol.FromAllow {
			if strings.Contains(e, "@") {
				a, _ := emailkind.Address(e)
				ok = ok || strings.EqualFold(a, from)
			} else {
				ok = ok || strings.EqualFold(e, domainOf(from))
			}
		}
		if !ok {
			return fenceerr.Invalid("payload.from", "%q is not an allowed sender (--mail-from-allow: %s)", from, strings.Join(pol.FromAllow, ", "))
		}
	}
	if len(pol.RcptAllow) > 0 {
		for _, f := range []struct {
			name string
			list []string
		}{{"to", p.To}, {"cc", p.Cc}, {"bcc", p.Bcc}} {
			for i, a := range f.list {
				addr, _ := emailkind.Address(a)
				ok := false
				for _, d := range pol.RcptAllow {
					ok = ok || strings.EqualFold(d, domainOf(addr))
				}
				if !ok {
					return fenceerr.Invalid(fmt.Sprintf("payload.%s[%d]", f.name, i), "%q is not at an allowed domain (--mail-rcpt-allow: %s)", addr, strings.Join(pol.RcptAllow, ", "))
				}
			}
		}
	}
	if _, rcpts := p.Envelope(); len(rcpts) > pol.max() {
		return fenceerr.Invalid("payload.to", "%d recipients, over the limit of %d (--mail-max-recipients)", len(rcpts), pol.max())
	}
	return nil
}

func (pol Policy) max() int {
	if pol.MaxRecipients == 0 {
		return DefaultMaxRecipients
	}
	return pol.MaxRecipients
}

// KindSpec is the email kind as the gateway's own intake registers it: the
// payload rules (emailkind) and this adapter's policy, so that mail
// outside it is refused at enqueue, naming the field.
func (a *Adapter) KindSpec() outbox.KindSpec { return PolicyKindSpec(a.cfg.Policy) }

// PolicyKindSpec is KindSpec for a policy, without an adapter.
func PolicyKindSpec(pol Policy) outbox.KindSpec {
	return outbox.KindSpec{DefaultFence: outbox.FenceCommit, Check: func(raw json.RawMessage) error {
		p, err := emailkind.Parse(raw)
		if err != nil {
			return err
		}
		return pol.Check(p)
	}}
}
