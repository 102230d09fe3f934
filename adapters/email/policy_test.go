package email_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/smtptest"
)

// The mail policy: only allowed senders, recipient domains and counts;
// refused at the intake (KindSpec, naming the field) and at execute
// (permanent, nothing sent); the envelope sender is the policy's.
func TestMailPolicy(t *testing.T) {
	t.Parallel()
	srv := smtptest.NewServer(t)
	a := newAdapter(t, email.Config{Addr: srv.Addr, StartTLS: email.StartTLSNone, Timeout: 5 * time.Second,
		Policy: email.Policy{FromAllow: []string{"reports@example.com", "billing.example.com"}, RcptAllow: []string{"example.com"},
			MaxRecipients: 2, EnvelopeFrom: "bounces@example.com"}})
	spec := a.KindSpec()
	for _, tc := range []struct{ payload, field string }{
		{`{"to":"a@example.com","from":"ceo@example.com","subject":"s","text":"t"}`, "payload.from"},
		{`{"to":"a@example.com","from":"x@sub.billing.example.com","subject":"s","text":"t"}`, "payload.from"},
		{`{"to":["a@example.com","b@elsewhere.org"],"from":"reports@example.com","subject":"s","text":"t"}`, "payload.to[1]"},
		{`{"to":"a@example.com","bcc":"spy@elsewhere.org","from":"reports@example.com","subject":"s","text":"t"}`, "payload.bcc[0]"},
		{`{"to":["a@example.com","b@example.com","c@example.com"],"from":"reports@example.com","subject":"s","text":"t"}`, "payload.to"},
	} {
		var inv *fenceerr.InvalidError
		if err := spec.Check(json.RawMessage(tc.payload)); !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("enqueue %s: %v, want an InvalidError naming %s", tc.payload, err, tc.field)
		}
		_, err := a.Execute(context.Background(), adapters.Request{IntentID: 1, Epoch: 1, IdempotencyKey: "k", Payload: json.RawMessage(tc.payload)})
		if !adapters.IsPermanent(err) || !strings.Contains(err.Error(), "mail policy") {
			t.Errorf("execute %s: %v, want permanent, the mail policy", tc.payload, err)
		}
	}
	if n := len(srv.Messages()); n != 0 {
		t.Fatalf("%d messages reached the server for refused mail", n)
	}
	for _, ok := range []string{
		`{"to":"a@example.com","from":"Reports <REPORTS@example.com>","subject":"s","text":"t"}`,
		`{"to":["a@example.com","A@example.com"],"from":"x@billing.example.com","subject":"s","text":"t"}`,
	} {
		if err := spec.Check(json.RawMessage(ok)); err != nil {
			t.Errorf("enqueue %s: %v", ok, err)
		}
	}
	if _, err := a.Execute(context.Background(), adapters.Request{IntentID: 2, Epoch: 1, IdempotencyKey: "ok",
		Payload: json.RawMessage(`{"to":"a@example.com","from":"reports@example.com","subject":"s","text":"t"}`)}); err != nil {
		t.Fatal(err)
	}
	msgs := srv.Messages()
	if len(msgs) != 1 || msgs[0].From != "bounces@example.com" {
		t.Fatalf("messages %+v, want one with envelope sender bounces@example.com", msgs)
	}
}
