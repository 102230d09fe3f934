package operator

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// storedInline is a webhook payload as an intent stored before inline
// credentials were refused holds it.
const storedInline = `{"url":"https://h.example/x?a=<b>","body":{"n":1},"headers":{
	"Authorization":"Bearer inline-cred-1","cookie":"sid=inline-cred-2","X-Api-Key":"inline-cred-3",
	"X-Forward":"Basic inline-cred-4","X-Partner":{"secret":"partner"},"X-Tenant":"t1"}}`

// seedStoredInline enqueues a webhook intent and gives it storedInline,
// the way an intent stored before the rule (or by a path that does not
// check it) holds it.
func (e *env) seedStoredInline(op string) int64 {
	e.t.Helper()
	res, err := e.ob.Enqueue(context.Background(), outbox.Intent{Resource: "r", Epoch: 1, OperationID: op, Kind: "webhook",
		Payload: []byte(`{"url":"https://h.example/x"}`)})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET payload = $2 WHERE intent_id = $1`),
		res.IntentID, storedInline); err != nil {
		e.t.Fatal(err)
	}
	return res.IntentID
}

// Get returns a webhook payload with the credentials given inline
// redacted and everything else as stored; the stored intent keeps them.
func TestGetRedactsInlineCredentials(t *testing.T) {
	e := setup(t)
	id := e.seedStoredInline("w")
	d, err := e.op.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(d.Payload), "inline-cred") {
		t.Fatalf("Get's payload carries a credential: %s", d.Payload)
	}
	var p struct {
		URL     string          `json:"url"`
		Body    json.RawMessage `json:"body"`
		Headers map[string]any  `json:"headers"`
	}
	if err := json.Unmarshal(d.Payload, &p); err != nil {
		t.Fatalf("payload %s: %v", d.Payload, err)
	}
	want := map[string]any{"Authorization": "(redacted)", "cookie": "(redacted)", "X-Api-Key": "(redacted)", "X-Forward": "(redacted)",
		"X-Partner": map[string]any{"secret": "partner"}, "X-Tenant": "t1"}
	for name, v := range want {
		g, _ := json.Marshal(p.Headers[name])
		w, _ := json.Marshal(v)
		if string(g) != string(w) {
			t.Errorf("headers.%s = %s, want %s", name, g, w)
		}
	}
	if len(p.Headers) != len(want) || p.URL != "https://h.example/x?a=<b>" || string(p.Body) != `{"n":1}` {
		t.Errorf("payload %s: want the rest as stored", d.Payload)
	}
	if n := e.count(`SELECT count(*) FROM fencegate.intents WHERE intent_id = $1 AND payload->'headers'->>'Authorization' = 'Bearer inline-cred-1'`, id); n != 1 {
		t.Errorf("the stored intent changed (%d rows with its value)", n)
	}
	// Another kind's payload is returned as stored.
	other := e.seed("e", outbox.StatusPending, "")
	if d, err := e.op.Get(context.Background(), other); err != nil || !strings.Contains(string(d.Payload), `"subject": "hi"`) {
		t.Errorf("email payload %s, %v: want it as stored", d.Payload, err)
	}
	t.Logf("%d headers checked", len(want))
}
