package email_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/kinds/emailkind"
)

// The policy's matching, entry by entry: an entry with "@" is one address
// (case-insensitive), one without is exactly that domain (not its
// subdomains, case-insensitive); recipient domains likewise; the recipient
// limit counts To+Cc+Bcc after dedup and defaults to 50; no lists: any.
func TestPolicyMatching(t *testing.T) {
	t.Parallel()
	msg := func(from string, to ...string) emailkind.Payload {
		b, _ := json.Marshal(map[string]any{"from": from, "to": to, "subject": "s", "text": "t"})
		p, err := emailkind.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	pol := email.Policy{FromAllow: []string{"Reports@Example.com", "billing.example.com"}, RcptAllow: []string{"Example.COM"}}
	for _, tc := range []struct {
		pol   email.Policy
		p     emailkind.Payload
		field string // "" allowed
	}{
		{pol, msg("reports@example.com", "a@example.com"), ""},
		{pol, msg("Reports <REPORTS@EXAMPLE.COM>", "a@example.com"), ""},
		{pol, msg("anyone@Billing.Example.com", "a@EXAMPLE.com"), ""},
		{pol, msg("other@example.com", "a@example.com"), "payload.from"},            // an address entry is not its domain
		{pol, msg("x@sub.billing.example.com", "a@example.com"), "payload.from"},    // nor is a domain its subdomains
		{pol, msg("x@evilbilling.example.com", "a@example.com"), "payload.from"},    // nor a suffix
		{pol, msg("reports@example.com.evil.org", "a@example.com"), "payload.from"}, // nor a prefix
		{pol, msg("reports@example.com", "a@example.com", "b@sub.example.com"), "payload.to[1]"},
		{pol, msg("reports@example.com", "a@notexample.com"), "payload.to[0]"},
		{email.Policy{}, msg("anyone@anywhere.org", "a@b.net"), ""},
		{email.Policy{MaxRecipients: 2}, msg("x@y.org", "a@b.net", "A@B.NET", "c@b.net"), ""},
		{email.Policy{MaxRecipients: 2}, msg("x@y.org", "a@b.net", "b@b.net", "c@b.net"), "payload.to"},
	} {
		err := tc.pol.Check(tc.p)
		var inv *fenceerr.InvalidError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v under %+v: %v, want allowed", tc.p, tc.pol, err)
		case tc.field != "" && (!errors.As(err, &inv) || inv.Field != tc.field):
			t.Errorf("%+v under %+v: %v, want refused naming %s", tc.p, tc.pol, err, tc.field)
		}
	}
	// The default limit is 50.
	var rcpts []string
	for i := range email.DefaultMaxRecipients + 1 {
		rcpts = append(rcpts, fmt.Sprintf("r%d@example.com", i))
	}
	if err := (email.Policy{}).Check(msg("x@example.com", rcpts[:50]...)); err != nil {
		t.Errorf("50 recipients: %v", err)
	}
	if err := (email.Policy{}).Check(msg("x@example.com", rcpts...)); err == nil || !strings.Contains(err.Error(), "51") {
		t.Errorf("51 recipients: %v, want refused", err)
	}
}

// The policy's own entries are checked, naming the field.
func TestPolicyCheckConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pol   email.Policy
		field string
	}{
		{email.Policy{FromAllow: []string{"reports@example.com", "example.org"}, RcptAllow: []string{"example.com"}, MaxRecipients: 5, EnvelopeFrom: "bounces@example.com"}, ""},
		{email.Policy{FromAllow: []string{"not an address@"}}, "FromAllow"},
		{email.Policy{FromAllow: []string{"exa mple.com"}}, "FromAllow"},
		{email.Policy{FromAllow: []string{"example.com"}, RcptAllow: []string{"a@example.com"}}, "RcptAllow"},
		{email.Policy{FromAllow: []string{"example.com"}, MaxRecipients: -1}, "MaxRecipients"},
		{email.Policy{FromAllow: []string{"example.com"}, EnvelopeFrom: "nobody"}, "EnvelopeFrom"},
	} {
		err := tc.pol.CheckConfig()
		var inv *fenceerr.InvalidError
		if tc.field == "" && err != nil || tc.field != "" && (!errors.As(err, &inv) || inv.Field != tc.field) {
			t.Errorf("%+v: %v, want field %q", tc.pol, err, tc.field)
		}
	}
}
