package admin

import (
	"net/http"
	"strings"
	"testing"
)

// enqueueWith sends POST /api/v1/intents with the Idempotency-Key header
// values given (none: no header), holding the exchange to the OpenAPI
// description as the walk does.
func (e *env) enqueueWith(body string, keys ...string) resp {
	e.t.Helper()
	w := &walker{t: e.t, sp: loadSpec(e.t), seen: map[string]map[int]int{}}
	return w.do(call{base: e.ts.URL, method: "POST", path: "/api/v1/intents", token: workerSecret, body: body,
		header: http.Header{"Idempotency-Key": keys}, beyond: "the header's rules"})
}

// noOpID is an email intent without operation_id.
const noOpID = `{"resource":"idem","epoch":1,"kind":"email",
	"payload":{"to":"alice@example.com","from":"reports@example.com","subject":"hi","text":"body"}}`

// The Idempotency-Key header is the operation id: a retry with the same
// header is the duplicate answer, as a retry with the same operation_id.
func TestIdempotencyKeyHeaderOnly(t *testing.T) {
	e := setup(t)
	e.atEpochOne("idem")
	r := e.enqueueWith(noOpID, "report-2026-12-01")
	expect(t, r, http.StatusCreated, "")
	if r.obj["operation_id"] != "report-2026-12-01" || r.obj["duplicate"] != false {
		t.Fatalf("enqueue with the header = %s", r.raw)
	}
	id := num(r.obj["intent_id"])
	// The lost response retried: the same header, the same intent.
	r = e.enqueueWith(noOpID, "report-2026-12-01")
	expect(t, r, http.StatusOK, "")
	if num(r.obj["intent_id"]) != id || r.obj["duplicate"] != true {
		t.Fatalf("retry with the same header = %s, want intent %d as a duplicate", r.raw, id)
	}
	// The IETF draft's form, a Structured Field string, is the same id;
	// so is the body's operation_id.
	r = e.enqueueWith(noOpID, `"report-2026-12-01"`)
	expect(t, r, http.StatusOK, "")
	if num(r.obj["intent_id"]) != id {
		t.Fatalf("retry with the quoted header = %s, want intent %d", r.raw, id)
	}
	expect(t, e.do("POST", "/api/v1/intents", workerSecret, emailIntent("idem", 1, "report-2026-12-01")), http.StatusOK, "")
	// Another id is another intent.
	r = e.enqueueWith(noOpID, "report-2026-12-02")
	expect(t, r, http.StatusCreated, "")
	if n := e.count(`SELECT count(*) FROM fencegate.intents WHERE resource_id = 'idem'`); n != 2 {
		t.Fatalf("%d intents stored, want 2", n)
	}
}

// Header and body both giving the operation id: equal is fine; different
// is 400 naming operation_id, and nothing is stored.
func TestIdempotencyKeyHeaderAndBody(t *testing.T) {
	e := setup(t)
	e.atEpochOne("idem")
	r := e.enqueueWith(emailIntent("idem", 1, "op-1"), "op-1")
	expect(t, r, http.StatusCreated, "")
	if r.obj["operation_id"] != "op-1" {
		t.Fatalf("enqueue with both equal = %s", r.raw)
	}
	r = e.enqueueWith(emailIntent("idem", 1, "op-2"), "op-3")
	expectField(t, r, "operation_id")
	if msg, _ := r.errField("message").(string); !strings.Contains(msg, "Idempotency-Key") {
		t.Fatalf("message %q should name the header", msg)
	}
	// The retry of op-1 with another header is refused too: the header
	// does not silently win over the body, nor the body over the header.
	expectField(t, e.enqueueWith(emailIntent("idem", 1, "op-1"), "op-9"), "operation_id")
	if n := e.count(`SELECT count(*) FROM fencegate.intents WHERE resource_id = 'idem'`); n != 1 {
		t.Fatalf("%d intents stored, want only op-1's", n)
	}
	if n := e.count(`SELECT count(*) FROM fencegate.intents WHERE operation_id IN ('op-2', 'op-3', 'op-9')`); n != 0 {
		t.Fatalf("%d intents stored for the refused requests", n)
	}
}

// Bad header values are 400 naming the header; nothing is stored.
func TestIdempotencyKeyHeaderRefused(t *testing.T) {
	e := setup(t)
	e.atEpochOne("idem")
	for _, keys := range [][]string{
		{"a", "b"},                 // twice
		{" "},                      // empty
		{`"unterminated`},          // not a Structured Field string
		{`"bad \x escape"`},        // an escape of something else
		{`""`},                     // an empty string
		{strings.Repeat("k", 201)}, // over operation_id's 200 bytes
		{"tab\there"},              // a control character
	} {
		r := e.enqueueWith(noOpID, keys...)
		expectField(t, r, "Idempotency-Key")
	}
	if n := e.count(`SELECT count(*) FROM fencegate.intents WHERE resource_id = 'idem'`); n != 0 {
		t.Fatalf("%d intents stored", n)
	}
	// Neither header nor operation_id: the body's field is what is missing.
	expectField(t, e.enqueueWith(noOpID), "operation_id")
}
