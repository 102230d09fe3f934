package email_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/kinds/emailkind"
	"github.com/fencegate/fencegate/outbox"
)

// The email kind has one set of payload rules (emailkind): the outbox's
// check at enqueue and the adapter's at execute refuse the same payloads,
// naming the same field, and the adapter's refusal is permanent (a payload
// that is wrong stays wrong). Nothing here reaches a server: the payload
// is refused before any connection.
func TestEnqueueAndExecuteShareOneRuleSet(t *testing.T) {
	t.Parallel()
	a, err := email.New(email.Config{Addr: "127.0.0.1:1", Policy: email.Policy{AnyFrom: true}})
	if err != nil {
		t.Fatal(err)
	}
	check := outbox.DefaultKinds()[emailkind.Name].Check
	checked := 0
	const ok = `"from":"b@example.com","subject":"s","text":"t"`
	for _, tc := range []struct{ payload, field string }{
		{`{` + ok + `}`, "payload.to"},
		{`{"to":[],` + ok + `}`, "payload.to"},
		{`{"to":42,` + ok + `}`, "payload.to"},
		{`{"to":["a@example.com",7],` + ok + `}`, "payload.to[1]"},
		{`{"to":"nobody",` + ok + `}`, "payload.to[0]"},
		{`{"to":"a@example.com","bcc":["x"],` + ok + `}`, "payload.bcc[0]"},
		{`{"to":"a@example.com","from":"nobody","subject":"s","text":"t"}`, "payload.from"},
		{`{"to":"a@example.com","from":"b@example.com","subject":"s\r\nBcc: x@y.z","text":"t"}`, "payload.subject"},
		{`{"to":"a@example.com","from":"b@example.com","subject":" ","text":"t"}`, "payload.subject"},
		{`{"to":"a@example.com","from":"b@example.com","subject":"s","text":5}`, "payload.text"},
		{`{"to":"a@example.com","from":"b@example.com","subject":"s"}`, "payload.text"},
		{`[1]`, "payload"},
		// Only the payload's own fields, spelt exactly: a misspelt or
		// differently-cased field would otherwise be dropped (a "Bcc"
		// the message went out without); encoding/json matches names
		// without case, the payload's rules do not.
		{`{"to":"a@example.com","Bcc":"boss@example.com",` + ok + `}`, "payload.Bcc"},
		{`{"To":"a@example.com",` + ok + `}`, "payload.To"},
		{`{"to":"a@example.com","TO":"b@example.com",` + ok + `}`, "payload.TO"},
		{`{"to":"a@example.com","reply_to":"x@example.com",` + ok + `}`, "payload.reply_to"},
		{`{"to":"a@example.com","extra":null,` + ok + `}`, "payload.extra"},
		{`{"to":"a@example.com","":1,` + ok + `}`, "payload"},
	} {
		checked++
		enqErr := check(json.RawMessage(tc.payload))
		var inv *fenceerr.InvalidError
		if !errors.As(enqErr, &inv) || inv.Field != tc.field {
			t.Errorf("enqueue check of %s = %v, want an InvalidError naming %s", tc.payload, enqErr, tc.field)
			continue
		}
		_, exErr := a.Execute(context.Background(), adapters.Request{IntentID: 1, Epoch: 1, IdempotencyKey: "k", Payload: json.RawMessage(tc.payload)})
		if !adapters.IsPermanent(exErr) || !strings.Contains(exErr.Error(), enqErr.Error()) {
			t.Errorf("execute of %s = %v, want permanent and the enqueue's error %q", tc.payload, exErr, enqErr)
		}
	}
	t.Logf("%d bad payloads checked at enqueue and execute", checked)
	if checked == 0 {
		t.Fatal("no payload checked")
	}
}

// A payload built in Go from the typed Payload is what Parse reads back.
func TestTypedPayloadRoundTrip(t *testing.T) {
	t.Parallel()
	in := emailkind.Payload{To: []string{"Ops <ops@example.com>", "a@example.com"}, Bcc: []string{"OPS@example.com"}, From: "b@example.com", Subject: "Nightly report", Text: "ok"}
	if err := in.Validate(); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(in)
	out, err := emailkind.Parse(raw)
	if err != nil {
		t.Fatalf("Parse(%s): %v", raw, err)
	}
	if strings.Join(out.To, ",") != strings.Join(in.To, ",") || out.Subject != in.Subject || out.Text != in.Text {
		t.Errorf("round trip: %+v, want %+v", out, in)
	}
	from, rcpts := out.Envelope()
	if from != "b@example.com" || strings.Join(rcpts, ",") != "ops@example.com,a@example.com" {
		t.Errorf("Envelope() = %q, %q; want b@example.com and ops@example.com,a@example.com once each", from, rcpts)
	}
}
