package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/migrations"
	"github.com/fencegate/fencegate/outbox"
)

// sqlErr is the SQLSTATE, the COLUMN (the field) and the DETAIL (JSON) of
// a refusal of the SQL interface.
type sqlErr struct {
	Code, Field string
	Detail      map[string]any
}

func asSQLErr(t *testing.T, err error) sqlErr {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not a PostgreSQL error", err)
	}
	e := sqlErr{Code: pe.Code, Field: pe.ColumnName}
	if pe.Detail != "" {
		if err := json.Unmarshal([]byte(pe.Detail), &e.Detail); err != nil {
			t.Fatalf("DETAIL %q is not JSON: %v", pe.Detail, err)
		}
	}
	return e
}

type enqueueArgs struct {
	resource  string
	epoch     int64
	operation string
	kind      string
	payload   string
	key       *string
	fence     *string
}

type enqueueOut struct {
	Outcome      string
	IntentID     int64
	Status       string
	CurrentEpoch int64
}

const enqueueSQL = `SELECT outcome, intent_id, status, current_epoch FROM fencegate.enqueue(
	resource => $1, epoch => $2, operation_id => $3, kind => $4, payload => $5::jsonb, key => $6, fence => $7)`

func sqlEnqueue(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, a enqueueArgs) (enqueueOut, error) {
	var o enqueueOut
	err := q.QueryRow(ctx, testdb.SQL(enqueueSQL), a.resource, a.epoch, a.operation, a.kind, a.payload, a.key, a.fence).
		Scan(&o.Outcome, &o.IntentID, &o.Status, &o.CurrentEpoch)
	return o, err
}

func ptr(s string) *string { return &s }

const mail = `{"to":"alice@example.com","from":"reports@example.com","subject":"Nightly report","text":"ready"}`

// sqlSetup is a migrated database with an application table of its own.
func sqlSetup(t *testing.T) (*pgxpool.Pool, *lease.Issuer) {
	t.Helper()
	pool := testdb.New(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE reports (day text PRIMARY KEY, sent boolean NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool, coretest.Issuer(pool)
}

// acquire grants resource to holder "A" for a minute: the lease a test's
// SQL enqueues write with.
func acquire(t *testing.T, iss *lease.Issuer, resource string) lease.Lease {
	t.Helper()
	l, err := iss.Acquire(context.Background(), resource, "A", time.Minute)
	if err != nil {
		t.Fatalf("acquire %s: %v", resource, err)
	}
	return l
}

// The SQL enqueue commits with the caller's own writes, or not at all; a
// retry after a lost response gets the same intent, also after a takeover;
// a stale epoch is ZF002 and aborts the caller's transaction; another
// content under the same operation id is ZF003; the intent is the one the
// Go client would have stored (its defaults), and the Go client's retry of
// it is a duplicate.
func TestSQLEnqueue(t *testing.T) {
	t.Parallel()
	pool, iss := sqlSetup(t)
	ctx := context.Background()
	l := acquire(t, iss, "nightly")
	a := enqueueArgs{resource: "nightly", epoch: l.Epoch, operation: "report-1", kind: "email", payload: mail}

	// Committed with the business row.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO reports VALUES ('2026-12-01', true)`); err != nil {
		t.Fatal(err)
	}
	// Durable whatever the session's synchronous_commit: the enqueue raises
	// it for the caller's transaction.
	if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
		t.Fatal(err)
	}
	got, err := sqlEnqueue(ctx, tx, a)
	if err != nil || got.Outcome != "created" || got.Status != "pending" || got.CurrentEpoch != l.Epoch || got.IntentID == 0 {
		t.Fatalf("enqueue = %+v, %v; want created, pending, current epoch %d", got, err, l.Epoch)
	}
	var sc string
	if err := tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&sc); err != nil || sc != "on" {
		t.Fatalf("synchronous_commit in the caller's transaction = %q, %v; want on", sc, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ob := coretest.Outbox(t, pool)
	rec, err := ob.Get(ctx, got.IntentID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.IdempotencyKey != "nightly/report-1" || rec.Fence != outbox.FenceCommit || rec.Kind != "email" || rec.Epoch != l.Epoch {
		t.Fatalf("stored %+v; want the Go client's defaults (key nightly/report-1, fence commit)", rec)
	}
	// The Go client's retry of the same intent is a duplicate: both sides
	// store the same content.
	res, err := ob.Enqueue(ctx, outbox.Intent{Resource: "nightly", Epoch: l.Epoch, OperationID: "report-1", Kind: "email", Payload: json.RawMessage(mail)})
	if err != nil || !res.Duplicate || res.IntentID != got.IntentID {
		t.Fatalf("Go retry = %+v, %v; want a duplicate of %d", res, err, got.IntentID)
	}

	// Rolled back with the business row: neither stays.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO reports VALUES ('2026-12-02', true)`); err != nil {
		t.Fatal(err)
	}
	rb := a
	rb.operation = "report-2"
	if got, err := sqlEnqueue(ctx, tx, rb); err != nil || got.Outcome != "created" {
		t.Fatalf("enqueue = %+v, %v", got, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT (SELECT count(*) FROM reports WHERE day = '2026-12-02')
		+ (SELECT count(*) FROM fencegate.intents WHERE operation_id = 'report-2')`)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after the rollback %d rows remain, %v; want 0", n, err)
	}

	// A takeover: the old epoch is fenced out, the caller's transaction
	// aborts, nothing of it is stored.
	if _, err := iss.Advance(ctx, "nightly", l.Epoch+3); err != nil {
		t.Fatal(err)
	}
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO reports VALUES ('2026-12-03', true)`); err != nil {
		t.Fatal(err)
	}
	st := a
	st.operation = "report-3"
	_, err = sqlEnqueue(ctx, tx, st)
	e := asSQLErr(t, err)
	if e.Code != "ZF002" || e.Detail["code"] != "stale_epoch" || e.Detail["current_epoch"] != float64(l.Epoch+3) || e.Detail["supplied_epoch"] != float64(l.Epoch) || e.Detail["resource"] != "nightly" {
		t.Fatalf("stale enqueue = %+v; want ZF002 with current_epoch %d, supplied_epoch %d", e, l.Epoch+3, l.Epoch)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the caller's transaction committed after a stale enqueue")
	}
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT (SELECT count(*) FROM reports WHERE day = '2026-12-03')
		+ (SELECT count(*) FROM fencegate.intents WHERE operation_id = 'report-3')`)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after a stale enqueue %d rows remain, %v; want 0", n, err)
	}

	// The retry of the first one, after the takeover: the same intent.
	if got2, err := sqlEnqueue(ctx, pool, a); err != nil || got2.Outcome != "duplicate" || got2.IntentID != got.IntentID || got2.CurrentEpoch != l.Epoch+3 {
		t.Fatalf("retry after the takeover = %+v, %v; want duplicate of %d (current epoch %d)", got2, err, got.IntentID, l.Epoch+3)
	}
	// Another content under that operation id: ZF003, naming the intent.
	c := a
	c.payload = strings.Replace(mail, "ready", "changed", 1)
	_, err = sqlEnqueue(ctx, pool, c)
	if e := asSQLErr(t, err); e.Code != "ZF003" || e.Detail["intent_id"] != float64(got.IntentID) {
		t.Fatalf("conflicting enqueue = %+v; want ZF003 naming intent %d", e, got.IntentID)
	}
	// Explicit key and fence are kept.
	l2 := acquire(t, iss, "files")
	f, err := sqlEnqueue(ctx, pool, enqueueArgs{resource: "files", epoch: l2.Epoch, operation: "f1", kind: "file",
		payload: `{"target":"out/a.txt","content":"x"}`, key: ptr("report-file"), fence: ptr("commit")})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := ob.Get(ctx, f.IntentID); err != nil || rec.IdempotencyKey != "report-file" || rec.Fence != outbox.FenceCommit {
		t.Fatalf("stored %+v, %v; want key report-file, fence commit", rec, err)
	}
	if f, err := sqlEnqueue(ctx, pool, enqueueArgs{resource: "files", epoch: l2.Epoch, operation: "f2", kind: "file",
		payload: `{"target":"out/b.txt","content":"x"}`}); err != nil {
		t.Fatal(err)
	} else if rec, err := ob.Get(ctx, f.IntentID); err != nil || rec.Fence != outbox.FenceExecute {
		t.Fatalf("file's default fence: %+v, %v; want execute", rec, err)
	}
}

// The SQL enqueue's commit wakes the dispatchers on the schema's channel.
func TestSQLEnqueueNotifies(t *testing.T) {
	t.Parallel()
	pool, iss := sqlSetup(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+testdb.PGSchema().IntentsChannel()); err != nil {
		t.Fatal(err)
	}
	l := acquire(t, iss, "n")
	if _, err := sqlEnqueue(ctx, pool, enqueueArgs{resource: "n", epoch: l.Epoch, operation: "o", kind: "email", payload: mail}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := conn.Conn().WaitForNotification(wctx); err != nil {
		t.Fatalf("no notification on %s: %v", testdb.PGSchema().IntentsChannel(), err)
	}
}

// Bad input is ZF004 naming the field, and stores nothing.
func TestSQLEnqueueBadInput(t *testing.T) {
	t.Parallel()
	pool, iss := sqlSetup(t)
	ctx := context.Background()
	l := acquire(t, iss, "r")
	ok := enqueueArgs{resource: "r", epoch: l.Epoch, operation: "o", kind: "email", payload: mail}
	long := strings.Repeat("x", 201)
	checked := 0
	for _, c := range []struct {
		name  string
		edit  func(a *enqueueArgs)
		field string
	}{
		{"no resource", func(a *enqueueArgs) { a.resource = "" }, "resource"},
		{"long resource", func(a *enqueueArgs) { a.resource = long }, "resource"},
		{"epoch 0", func(a *enqueueArgs) { a.epoch = 0 }, "epoch"},
		{"epoch above 2^53", func(a *enqueueArgs) { a.epoch = 1<<53 + 1 }, "epoch"},
		{"no operation", func(a *enqueueArgs) { a.operation = "" }, "operation_id"},
		{"long operation", func(a *enqueueArgs) { a.operation = long }, "operation_id"},
		{"no kind", func(a *enqueueArgs) { a.kind = "" }, "kind"},
		{"unknown kind", func(a *enqueueArgs) { a.kind = "notify" }, "kind"},
		{"bad fence", func(a *enqueueArgs) { a.fence = ptr("later") }, "fence"},
		{"long key", func(a *enqueueArgs) { a.key = ptr(strings.Repeat("k", 256)) }, "idempotency_key"},
		{"long default key", func(a *enqueueArgs) { a.resource, a.operation = strings.Repeat("r", 200), strings.Repeat("o", 60) }, "idempotency_key"},
		{"payload not an object", func(a *enqueueArgs) { a.payload = `[1]` }, "payload"},
		{"payload too large", func(a *enqueueArgs) { a.payload = `{"x":"` + strings.Repeat("y", 262144) + `"}` }, "payload"},
		{"bad recipient", func(a *enqueueArgs) { a.payload = strings.Replace(mail, "alice@example.com", "alice", 1) }, "payload.to[0]"},
		{"no subject", func(a *enqueueArgs) { a.payload = strings.Replace(mail, "Nightly report", " ", 1) }, "payload.subject"},
		{"file escapes", func(a *enqueueArgs) { a.kind, a.payload = "file", `{"target":"../x","content":"y"}` }, "payload.target"},
		{"email unknown field", func(a *enqueueArgs) { a.payload = strings.Replace(mail, `"to"`, `"Bcc":"boss@example.com","to"`, 1) }, "payload.Bcc"},
		{"email field name case", func(a *enqueueArgs) { a.payload = strings.Replace(mail, `"to"`, `"To"`, 1) }, "payload.To"},
		{"file unknown field", func(a *enqueueArgs) { a.kind, a.payload = "file", `{"target":"a.txt","content":"y","extra":true}` }, "payload.extra"},
	} {
		checked++
		a := ok
		a.operation = "op-" + c.name
		c.edit(&a)
		_, err := sqlEnqueue(ctx, pool, a)
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if e := asSQLErr(t, err); e.Code != "ZF004" || e.Field != c.field || e.Detail["field"] != c.field || e.Detail["code"] != "invalid_input" {
			t.Errorf("%s: %+v (%v); want ZF004 naming %s", c.name, e, err, c.field)
		}
	}
	t.Logf("%d bad inputs checked", checked)
	if checked == 0 {
		t.Fatal("no bad input checked")
	}
	// NULL arguments (SQL has them, Go's strings do not).
	for field, call := range map[string]string{
		"resource":     `fencegate.enqueue(NULL, 1, 'o', 'email', $1::jsonb)`,
		"epoch":        `fencegate.enqueue('r', NULL, 'o', 'email', $1::jsonb)`,
		"operation_id": `fencegate.enqueue('r', 1, NULL, 'email', $1::jsonb)`,
		"kind":         `fencegate.enqueue('r', 1, 'o', NULL, $1::jsonb)`,
		"payload":      `fencegate.enqueue('r', 1, 'o', 'email', NULL::jsonb || $1::jsonb)`,
	} {
		_, err := pool.Exec(ctx, testdb.SQL(`SELECT * FROM `+call), mail)
		if err == nil {
			t.Errorf("%s: accepted", call)
			continue
		}
		if e := asSQLErr(t, err); e.Code != "ZF004" || e.Field != field {
			t.Errorf("%s: %+v (%v); want ZF004 naming %s", call, e, err, field)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.intents`)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d intents stored by refused enqueues, %v", n, err)
	}
}

// checkSQL runs the SQL interface's payload check; "" when it accepts,
// else the field it names.
func checkSQL(ctx context.Context, t *testing.T, pool *pgxpool.Pool, kind, payload string) (field string, accepted bool) {
	t.Helper()
	_, err := pool.Exec(ctx, testdb.SQL(`SELECT fencegate.fencegate_check_payload($1, $2::jsonb)`), kind, payload)
	if err == nil {
		return "", true
	}
	e := asSQLErr(t, err)
	if e.Code != "ZF004" {
		t.Fatalf("check of %s %s: %v; want ZF004", kind, payload, err)
	}
	return e.Field, false
}

// checkGo runs the Go client's check of the kind (outbox.DefaultKinds).
func checkGo(kind, payload string) (field string, accepted bool) {
	err := outbox.DefaultKinds()[kind].Check(json.RawMessage(payload))
	if err == nil {
		return "", true
	}
	var inv *fenceerr.InvalidError
	if errors.As(err, &inv) {
		return inv.Field, false
	}
	return "payload", false
}

// The SQL interface checks the built-in kinds' payloads in the database
// with the Go parsers' rules or stricter ones: it never accepts a payload
// the Go client refuses (which an adapter would refuse at execute). The
// corpus pins the common cases (both accept; both refuse naming the same
// field); the random mutations search for a payload only SQL accepts.
func TestSQLPayloadRulesNeverLooser(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	type tc struct{ kind, payload, field string } // field "": both accept
	corpus := []tc{
		{"email", mail, ""},
		{"email", `{"to":["a@example.com","B <b@example.co.jp>"],"cc":"c+tag@x-y.example","bcc":[],"from":"Ops Team <ops@example.com>","subject":"夜間レポート","html":"<p>x</p>"}`, ""},
		{"email", `{"to":"a@example.com","cc":null,"bcc":null,"from":"b@example.com","subject":"s","text":"t","html":null}`, ""},
		// Only the kind's own fields, spelt exactly (JSON keys are
		// case-sensitive; encoding/json's struct decoding is not): a
		// misspelt field would be dropped, a "Bcc" the mail went without.
		{"email", `{"to":"a@example.com","Bcc":"boss@example.com","from":"b@example.com","subject":"s","text":"t"}`, "payload.Bcc"},
		{"email", `{"To":"a@example.com","from":"b@example.com","subject":"s","text":"t"}`, "payload.To"},
		{"email", `{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t","extra":null}`, "payload.extra"},
		{"email", `{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t","reply_to":"x@example.com","Cc":"c@example.com"}`, "payload.Cc"},
		{"email", `{"to":"nobody","from":"b@example.com","subject":"s","text":"t","extra":1}`, "payload.extra"},
		{"email", `{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t","":1}`, "payload"},
		{"email", `{"to":null,"from":"b@example.com","subject":"s","text":"t"}`, "payload.to"},
		{"email", `{"to":[],"from":"b@example.com","subject":"s","text":"t"}`, "payload.to"},
		{"email", `{"to":42,"from":"b@example.com","subject":"s","text":"t"}`, "payload.to"},
		{"email", `{"to":["a@example.com",7],"from":"b@example.com","subject":"s","text":"t"}`, "payload.to[1]"},
		{"email", `{"to":"nobody","from":"b@example.com","subject":"s","text":"t"}`, "payload.to[0]"},
		{"email", `{"to":"a@example.com","bcc":["x"],"from":"b@example.com","subject":"s","text":"t"}`, "payload.bcc[0]"},
		{"email", `{"to":"a@example.com","from":"nobody","subject":"s","text":"t"}`, "payload.from"},
		{"email", `{"to":"a@example.com","from":" ","subject":"s","text":"t"}`, "payload.from"},
		{"email", `{"to":"a@example.com","from":"b@example.com","subject":"s\r\nBcc: x@y.z","text":"t"}`, "payload.subject"},
		{"email", `{"to":"a@example.com","from":"b@example.com","subject":" \u3000\u00a0","text":"t"}`, "payload.subject"},
		{"email", `{"to":"a@example.com","from":"b@example.com","subject":"s","text":5}`, "payload.text"},
		{"email", `{"to":"a@example.com","from":"b@example.com","subject":"s"}`, "payload.text"},
		{"email", `{"to":"a@example.com","from":"b@example.com","subject":"s","text":"","html":""}`, "payload.text"},
		{"email", `[1]`, "payload"},
		{"file", `{"target":"reports/2026-12-01.txt","content":"x"}`, ""},
		{"file", `{"target":"a/b","content_base64":"aGk="}`, ""},
		{"file", `{"target":"a/b","content":"x","content_base64":null}`, ""},
		{"file", `{"target":"a/b","content_base64":"aGk=","extra":true}`, "payload.extra"},
		{"file", `{"Target":"a/b","content":"x"}`, "payload.Target"},
		{"file", `{"target":"a/b","content":"x","Content":"y"}`, "payload.Content"},
		{"file", `{"target":"../x","content":"x","mode":"0600"}`, "payload.mode"},
		{"file", `{"content":"x"}`, "payload.target"},
		{"file", `{"target":7,"content":"x"}`, "payload.target"},
		{"file", `{"target":"/etc/passwd","content":"x"}`, "payload.target"},
		{"file", `{"target":"\\x","content":"x"}`, "payload.target"},
		{"file", `{"target":"a/../../etc/passwd","content":"x"}`, "payload.target"},
		{"file", `{"target":"dir/","content":"x"}`, "payload.target"},
		{"file", `{"target":"a//b","content":"x"}`, "payload.target"},
		{"file", `{"target":"./a","content":"x"}`, "payload.target"},
		{"file", `{"target":".","content":"x"}`, "payload.target"},
		{"file", `{"target":"reports/.Nightly.txt.FENCEGATE.json","content":"x"}`, "payload.target"},
		{"file", `{"target":"reports/\u202etxt.exe","content":"x"}`, "payload.target"},
		{"file", `{"target":"reports/a\u200bb.txt","content":"x"}`, "payload.target"},
		{"file", `{"target":"\ufeffx","content":"x"}`, "payload.target"},
		{"file", `{"target":"a\tb","content":"x"}`, "payload.target"},
		{"file", `{"target":"a\u0085b","content":"x"}`, "payload.target"},
		{"file", `{"target":"tag\udb40\udc01x","content":"x"}`, "payload.target"},
		{"file", `{"target":"-rf","content":"x"}`, "payload.target"},
		{"file", `{"target":"reports/-n.txt","content":"x"}`, "payload.target"},
		// Names a file system takes (255 bytes; the file's own 235, for
		// the adapter's .<name>.fencegate.json.tmp beside it), in both
		// the one-expression path (ASCII) and the checks (not ASCII).
		{"file", `{"target":"` + strings.Repeat("d", 255) + `/` + strings.Repeat("n", 235) + `","content":"x"}`, ""},
		{"file", `{"target":"` + strings.Repeat("d", 256) + `/x","content":"x"}`, "payload.target"},
		{"file", `{"target":"` + strings.Repeat("n", 236) + `","content":"x"}`, "payload.target"},
		{"file", `{"target":"d/` + strings.Repeat("é", 117) + `","content":"x"}`, ""},
		{"file", `{"target":"d/` + strings.Repeat("é", 118) + `","content":"x"}`, "payload.target"},
		{"file", `{"target":"` + strings.Repeat("é", 128) + `/x","content":"x"}`, "payload.target"},
		{"file", `{"target":"reports/a-b/c-.txt","content":"x"}`, ""},
		{"file", `{"target":"x"}`, "payload.content"},
		{"file", `{"target":"x","content":null}`, "payload.content"},
		{"file", `{"target":"x","content":"a","content_base64":"YQ=="}`, "payload.content"},
		{"file", `{"target":"x","content":5}`, "payload.content"},
		{"file", `{"target":"x","content_base64":"!!!"}`, "payload.content_base64"},
		{"webhook", `{"url":"https://hooks.example.com/a/b?x=1&y=%20z","method":"PUT","headers":{"X-Api-Key":{"secret":"k"},"X-Tenant":"t"},"body":{"a":[1,null]},"lookup_url":"http://hooks.example.com:8080/lookup"}`, ""},
		{"webhook", `{"url":"https://h.example/x","body_base64":"aGk=","content_type":"text/plain"}`, ""},
		{"webhook", `{"url":"https://h.example/x","body":null}`, ""},
		{"webhook", `{"method":"POST"}`, "payload.url"},
		{"webhook", `{"url":"ftp://h.example/x"}`, "payload.url"},
		{"webhook", `{"url":"https://user:pw@h.example/x"}`, "payload.url"},
		{"webhook", `{"url":"https://h.example/x#frag"}`, "payload.url"},
		{"webhook", `{"url":"https://h.example/x","method":"GET"}`, "payload.method"},
		{"webhook", `{"url":"https://h.example/x","headers":{"Idempotency-Key":"x"}}`, "payload.headers.Idempotency-Key"},
		{"webhook", `{"url":"https://h.example/x","headers":{"content-type":"x"}}`, "payload.headers.content-type"},
		{"webhook", `{"url":"https://h.example/x","headers":{"Host":"x"}}`, "payload.headers.Host"},
		{"webhook", `{"url":"https://h.example/x","headers":{"Bad Name":"x"}}`, "payload.headers.Bad Name"},
		{"webhook", `{"url":"https://h.example/x","headers":{"X":"a\nb"}}`, "payload.headers.X"},
		{"webhook", `{"url":"https://h.example/x","headers":{"X":1}}`, "payload.headers.X"},
		{"webhook", `{"url":"https://h.example/x","headers":{"Authorization":"Bearer t"}}`, "payload.headers.Authorization"},
		{"webhook", `{"url":"https://h.example/x","headers":{"x-session-id":"s"}}`, "payload.headers.x-session-id"},
		{"webhook", `{"url":"https://h.example/x","headers":{"X-Forward":" basic\tt"}}`, "payload.headers.X-Forward"},
		{"webhook", `{"url":"https://h.example/x","headers":{"Authorization":{"secret":""}}}`, "payload.headers.Authorization"},
		{"webhook", `{"url":"https://h.example/x","headers":{"Authorization":{"secret":"a b"}}}`, "payload.headers.Authorization"},
		{"webhook", `{"url":"https://h.example/x","headers":{"Authorization":{"secret":"x","y":1}}}`, "payload.headers.Authorization"},
		{"webhook", `{"url":"https://h.example/x","headers":{"Authorization":{"secret":null}}}`, "payload.headers.Authorization"},
		{"webhook", `{"url":"https://h.example/x","headers":{"Idempotency-Key":{"secret":"x"}}}`, "payload.headers.Idempotency-Key"},
		{"webhook", `{"url":"https://h.example/x","body":1,"body_base64":"aGk="}`, "payload.body"},
		{"webhook", `{"url":"https://h.example/x","body_base64":"aGk="}`, "payload.content_type"},
		{"webhook", `{"url":"https://h.example/x","content_type":"text/plain"}`, "payload.content_type"},
		{"webhook", `{"url":"https://h.example/x","lookup_url":"mailto:x@y"}`, "payload.lookup_url"},
		{"webhook", `{"url":"https://h.example/x","header":{}}`, "payload.header"},
		{"s3", `{"bucket":"my-bucket.1","key":"reports/a.txt","content":"x","content_type":"text/plain","metadata":{"day":"2026-12-01"}}`, ""},
		{"s3", `{"key":"a","content_base64":"aGk="}`, ""},
		{"s3", `{"bucket":"AB","key":"a","content":"x"}`, "payload.bucket"},
		{"s3", `{"key":".fencegate/receipts/x","content":"x"}`, "payload.key"},
		{"s3", `{"key":"a/../%2EFenceGate/x","content":"x"}`, "payload.key"},
		{"s3", `{"key":"a/.fencegate/x","content":"x"}`, ""},
		{"s3", `{"bucket":"-ab","key":"a","content":"x"}`, "payload.bucket"},
		{"s3", `{"key":"../a","content":"x"}`, "payload.key"},
		{"s3", `{"key":"a/\u202eb","content":"x"}`, "payload.key"},
		{"s3", `{"key":"a","content":"x","metadata":{"Day":"x"}}`, "payload.metadata.Day"},
		{"s3", `{"key":"a","content":"x","metadata":{"fencegate-epoch":"x"}}`, "payload.metadata.fencegate-epoch"},
		{"s3", `{"key":"a","content":"x","metadata":{"a":"` + strings.Repeat("v", 1024) + `"}}`, "payload.metadata"},
		{"s3", `{"key":"a","content":"x","content_type":"a\r\nb"}`, "payload.content_type"},
		{"s3", `{"key":"a","content":"x","acl":"public"}`, "payload.acl"},
	}
	t.Logf("%d corpus payloads", len(corpus))
	if len(corpus) == 0 {
		t.Fatal("no corpus payload checked")
	}
	for _, c := range corpus {
		gf, gok := checkGo(c.kind, c.payload)
		sf, sok := checkSQL(ctx, t, pool, c.kind, c.payload)
		switch {
		case c.field == "" && (!gok || !sok):
			t.Errorf("%s %s: Go accepts %v (%s), SQL accepts %v (%s); want both to accept", c.kind, c.payload, gok, gf, sok, sf)
		case c.field != "" && (gok || sok || gf != c.field || sf != c.field):
			t.Errorf("%s %s: Go %v %q, SQL %v %q; want both to refuse naming %s", c.kind, c.payload, gok, gf, sok, sf, c.field)
		}
	}

	// Random mutations of valid payloads: whatever SQL accepts, Go accepts.
	seed := uint64(time.Now().UnixNano())
	t.Logf("mutation seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 19))
	bases := map[string][]map[string]any{}
	for _, c := range corpus {
		if c.field == "" {
			var m map[string]any
			if err := json.Unmarshal([]byte(c.payload), &m); err != nil {
				t.Fatal(err)
			}
			bases[c.kind] = append(bases[c.kind], m)
		}
	}
	kinds := slices.Sorted(func(yield func(string) bool) {
		for k := range bases {
			if !yield(k) {
				return
			}
		}
	})
	accepted, tried := 0, 0
	const rounds = 3000
	for range rounds {
		kind := kinds[rng.IntN(len(kinds))]
		p := mutate(rng, bases[kind][rng.IntN(len(bases[kind]))])
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		tried++
		_, sok := checkSQL(ctx, t, pool, kind, string(raw))
		if !sok {
			continue
		}
		accepted++
		if gf, gok := checkGo(kind, string(raw)); !gok {
			t.Errorf("SQL accepts a %s payload Go refuses (%s): %s", kind, gf, raw)
		}
	}
	t.Logf("%d mutations, %d accepted by SQL (and Go)", tried, accepted)
	if accepted < rounds/20 {
		t.Errorf("only %d of %d mutations accepted: the mutations hardly test acceptance", accepted, rounds)
	}
}

// pieces are what mutate puts into strings: the characters address, path
// and URL rules care about.
var pieces = []string{"a", "Z", "0", ".", "..", "/", "\\", "@", "<", ">", " ", "\u00a0", "\u3000", "\r", "\n",
	"%", "%2F", "%zz", "#", "?", "=", ":", "&", "-", "_", "+", "=?utf-8?q?x?=", "\"", "'", "(", ")", ",", ";",
	"[", "]", "é", "日", ".fencegate.", "http://", "https://", "user:pw@", "example.com", ":80", "aGk=", "==", "*"}

// mutate returns a copy of m with one or a few random edits: a string
// changed (characters inserted, replaced, removed), a field removed,
// added, made null or of another type.
func mutate(rng *rand.Rand, m map[string]any) map[string]any {
	out := map[string]any{}
	raw, _ := json.Marshal(m)
	_ = json.Unmarshal(raw, &out)
	for range 1 + rng.IntN(3) {
		keys := make([]string, 0, len(out))
		for k := range out {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if len(keys) == 0 {
			out["x"] = "y"
			continue
		}
		k := keys[rng.IntN(len(keys))]
		switch rng.IntN(10) {
		case 0:
			delete(out, k)
		case 1:
			out[k] = nil
		case 2:
			out[k] = []any{mutateString(rng, "a@example.com"), 1}[rng.IntN(2)]
		case 3:
			out[[]string{"to", "cc", "bcc", "from", "subject", "text", "html", "target", "content", "content_base64",
				"url", "method", "headers", "body", "body_base64", "content_type", "lookup_url", "bucket", "key", "metadata", "x"}[rng.IntN(21)]] = mutateString(rng, "")
		default:
			switch v := out[k].(type) {
			case string:
				out[k] = mutateString(rng, v)
			case []any:
				if len(v) > 0 {
					i := rng.IntN(len(v))
					if s, ok := v[i].(string); ok {
						v[i] = mutateString(rng, s)
					}
				}
			case map[string]any:
				for hk, hv := range v {
					if s, ok := hv.(string); ok && rng.IntN(2) == 0 {
						v[hk] = mutateString(rng, s)
					} else if rng.IntN(3) == 0 {
						delete(v, hk)
						v[mutateString(rng, hk)] = hv
					}
				}
			}
		}
	}
	return out
}

func mutateString(rng *rand.Rand, s string) string {
	r := []rune(s)
	for range 1 + rng.IntN(3) {
		p := []rune(pieces[rng.IntN(len(pieces))])
		i := 0
		if len(r) > 0 {
			i = rng.IntN(len(r) + 1)
		}
		switch rng.IntN(3) {
		case 0: // insert
			r = slices.Concat(r[:i], p, r[i:])
		case 1: // replace one
			if i < len(r) {
				r = slices.Concat(r[:i], p, r[i+1:])
			}
		default: // remove one
			if i < len(r) {
				r = slices.Delete(r, i, i+1)
			}
		}
	}
	return string(r)
}

// acquire, renew and release through SQL are the issuer's: each acquire a
// new epoch recorded in the history as Go's grants are, ZF005 for another
// holder's live lease, ZF002 for a renew or release of an epoch that moved
// on, ZF004 naming a bad argument; the Go issuer and SQL interleave.
func TestSQLLease(t *testing.T) {
	t.Parallel()
	pool, iss := sqlSetup(t)
	ctx := context.Background()
	acquire := func(resource, holder string, ttl time.Duration) (int64, error) {
		var epoch int64
		err := pool.QueryRow(ctx, testdb.SQL(`SELECT epoch FROM fencegate.acquire($1, $2, $3 * interval '1 microsecond')`),
			resource, holder, ttl.Microseconds()).Scan(&epoch)
		return epoch, err
	}
	renew := func(resource, holder string, epoch int64) error {
		_, err := pool.Exec(ctx, testdb.SQL(`SELECT fencegate.renew($1, $2, $3, interval '1 minute')`), resource, holder, epoch)
		return err
	}
	release := func(resource, holder string, epoch int64) error {
		_, err := pool.Exec(ctx, testdb.SQL(`SELECT fencegate.release($1, $2, $3)`), resource, holder, epoch)
		return err
	}
	var version int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT fencegate.interface_version()`)).Scan(&version); err != nil || version != 1 {
		t.Fatalf("interface_version() = %d, %v; want 1", version, err)
	}
	e1, err := acquire("r", "A", time.Minute)
	if err != nil || e1 != 1 {
		t.Fatalf("first acquire = %d, %v; want epoch 1", e1, err)
	}
	e2, err := acquire("r", "A", time.Minute)
	if err != nil || e2 != 2 {
		t.Fatalf("acquire again by the holder = %d, %v; want a new epoch 2", e2, err)
	}
	_, err = acquire("r", "B", time.Minute)
	if e := asSQLErr(t, err); e.Code != "ZF005" || e.Detail["holder"] != "A" || e.Detail["current_epoch"] != float64(2) || e.Detail["code"] != "lease_held" {
		t.Fatalf("acquire by B = %+v; want ZF005 naming A at epoch 2", e)
	}
	if err := renew("r", "A", 2); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if e := asSQLErr(t, renew("r", "A", 1)); e.Code != "ZF002" || e.Detail["current_epoch"] != float64(2) {
		t.Fatalf("renew of epoch 1 = %+v; want ZF002 at current epoch 2", e)
	}
	if e := asSQLErr(t, renew("r", "B", 2)); e.Code != "ZF002" || !strings.Contains(fmt.Sprint(e.Detail["reason"]), `"A"`) {
		t.Fatalf("renew by B = %+v; want ZF002, the lease held by A", e)
	}
	if err := release("r", "A", 2); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := release("r", "A", 2); err != nil {
		t.Fatalf("release again: %v", err)
	}
	// Go after SQL, SQL after Go: one sequence of epochs.
	gl, err := iss.Acquire(ctx, "r", "B", time.Minute)
	if err != nil || gl.Epoch != 3 {
		t.Fatalf("Go acquire after the SQL release = %+v, %v; want epoch 3", gl, err)
	}
	if _, err := pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.resources SET lease_expires_at = now() - interval '1 second' WHERE resource_id = 'r'`)); err != nil {
		t.Fatal(err)
	}
	e4, err := acquire("r", "C", time.Minute)
	if err != nil || e4 != 4 {
		t.Fatalf("SQL acquire after B's lease expired = %d, %v; want 4", e4, err)
	}
	hist, err := iss.History(ctx, "r", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range hist {
		got = append(got, fmt.Sprintf("%d %s %s prev=%d/%s", g.Epoch, g.Holder, g.How, g.PreviousEpoch, g.PreviousHolder))
	}
	want := []string{"4 C after_expiry prev=3/B", "3 B released prev=2/A", "2 A reacquired prev=1/A", "1 A free prev=0/"}
	if !slices.Equal(got, want) {
		t.Fatalf("history = %q; want %q", got, want)
	}
	for _, c := range []struct {
		name, sql, field string
	}{
		{"ttl", `SELECT fencegate.acquire('x', 'A', interval '1 millisecond')`, "ttl"},
		{"holder", `SELECT fencegate.acquire('x', '', interval '1 minute')`, "holder"},
		{"resource", `SELECT fencegate.renew('', 'A', 1, interval '1 minute')`, "resource"},
		{"epoch", `SELECT fencegate.release('x', 'A', 0)`, "epoch"},
	} {
		_, err := pool.Exec(ctx, testdb.SQL(c.sql))
		if e := asSQLErr(t, err); e.Code != "ZF004" || e.Field != c.field {
			t.Errorf("%s: %+v; want ZF004 naming %s", c.name, e, c.field)
		}
	}
}

// A lease through SQL lasts the ttl's length, as the Go issuer's duration
// does, so the 24 h bound holds whatever units the interval is written in:
// months, which have no fixed length, are refused naming ttl (PostgreSQL
// compares a month as 30 days but adds calendar months: "1000 mon -30000
// days 1 hour" was 1 h to the bound and 437 days to the expiry), and a
// day is 24 h.
func TestSQLLeaseTTLIsItsLength(t *testing.T) {
	t.Parallel()
	pool, _ := sqlSetup(t)
	ctx := context.Background()
	lasts := func(sql string, args ...any) (time.Duration, error) {
		var secs float64
		err := pool.QueryRow(ctx, testdb.SQL(sql), args...).Scan(&secs)
		return time.Duration(secs * float64(time.Second)), err
	}
	const calendar = `1000 mon -30000 days 1 hour`
	checks := 0
	for _, c := range []string{
		`SELECT fencegate.acquire('r', 'A', $1::interval)`,
		`SELECT fencegate.renew('r', 'A', 1, $1::interval)`,
	} {
		if _, err := pool.Exec(ctx, testdb.SQL(`SELECT fencegate.acquire('r', 'A', interval '1 minute')`)); err != nil {
			t.Fatal(err)
		}
		_, err := pool.Exec(ctx, testdb.SQL(c), calendar)
		checks++
		if e := asSQLErr(t, err); e.Code != "ZF004" || e.Field != "ttl" {
			t.Errorf("%s with ttl %q: %+v; want ZF004 naming ttl", c, calendar, e)
		}
	}
	if d, err := lasts(`SELECT extract(epoch FROM fencegate.renew('r', 'A', 2, interval '23 hours 60 minutes') - now())`); err != nil || d < 24*time.Hour-time.Minute || d > 24*time.Hour {
		t.Errorf("renew with ttl 23 hours 60 minutes: lease of %s, %v; want 24h", d, err)
	}
	checks++
	for _, ttl := range []string{"1 mon", "1 year -360 days", "25 hours", "1 day 1 second", "-1 hour"} {
		_, err := pool.Exec(ctx, testdb.SQL(`SELECT fencegate.acquire('r2', 'A', $1::interval)`), ttl)
		checks++
		if e := asSQLErr(t, err); e.Code != "ZF004" || e.Field != "ttl" {
			t.Errorf("acquire with ttl %q: %+v; want ZF004 naming ttl", ttl, e)
		}
	}
	d, err := lasts(`SELECT extract(epoch FROM expires_at - now()) FROM fencegate.acquire('r3', 'A', interval '1 day')`)
	checks++
	if err != nil || d < 24*time.Hour-time.Minute || d > 24*time.Hour {
		t.Errorf("acquire with ttl 1 day: lease of %s, %v; want 24h", d, err)
	}
	t.Logf("%d ttl cases", checks)
	if checks < 8 {
		t.Fatalf("only %d ttl cases checked", checks)
	}
}

// A SQL worker's transaction may carry a W3C trace context for the
// intent (SET LOCAL fencegate.trace_context, the setting the Go client
// uses): a JSON object of strings of at most 4096 bytes, stored with the
// intent; anything else is ZF004 naming trace_context and stores nothing
// (it was stored unchecked, of any size, or failed as 22P02).
func TestSQLEnqueueTraceContext(t *testing.T) {
	t.Parallel()
	pool, iss := sqlSetup(t)
	ctx := context.Background()
	l := acquire(t, iss, "r")
	enqueueWith := func(op, tc string) (enqueueOut, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `SELECT set_config('fencegate.trace_context', $1, true)`, tc); err != nil {
			t.Fatal(err)
		}
		out, err := sqlEnqueue(ctx, tx, enqueueArgs{resource: "r", epoch: l.Epoch, operation: op, kind: "email", payload: mail})
		if err != nil {
			return out, err
		}
		return out, tx.Commit(ctx)
	}
	const good = `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`
	out, err := enqueueWith("op-good", good)
	if err != nil || out.Outcome != "created" {
		t.Fatalf("enqueue with a trace context: %+v, %v", out, err)
	}
	var stored string
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT trace_context::text FROM fencegate.intents WHERE intent_id = $1`), out.IntentID).Scan(&stored); err != nil || !strings.Contains(stored, "4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Errorf("stored trace context %q, %v", stored, err)
	}
	cases := map[string]string{
		"too large":      `{"traceparent": "` + strings.Repeat("a", 4096) + `"}`,
		"an array":       `[1, 2, 3]`,
		"not JSON":       `not json`,
		"not strings":    `{"traceparent": 1}`,
		"a nested value": `{"traceparent": {"a": "b"}}`,
	}
	for name, tc := range cases {
		_, err := enqueueWith("op-"+name, tc)
		if err == nil {
			t.Errorf("trace context %s: accepted", name)
			continue
		}
		if e := asSQLErr(t, err); e.Code != "ZF004" || e.Field != "trace_context" {
			t.Errorf("trace context %s: %+v (%v); want ZF004 naming trace_context", name, e, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.intents`)).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d intents stored (%v); want only the good one", n, err)
	}
	t.Logf("%d bad trace contexts refused", len(cases))
}

// Every function in the schema has its search_path pinned to the catalog
// alone, naming fencegate's tables with the schema (TestFunctionsQualified):
// called from a session whose search_path leads to an application's own
// tables of the same names (every test database has public.intents), it
// still reads fencegate's.
func TestFunctionsPinned(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT p.proname, coalesce(array_to_string(p.proconfig, ';'), '')
		FROM pg_proc p WHERE p.pronamespace = $1::regnamespace ORDER BY 1`, testdb.Schema())
	if err != nil {
		t.Fatal(err)
	}
	type fn struct{ name, config string }
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn, error) {
		var f fn
		return f, r.Scan(&f.name, &f.config)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(fns) < 20 {
		t.Fatalf("%d functions in schema %s; want fencegate's", len(fns), testdb.Schema())
	}
	want := pinnedPath
	for _, f := range fns {
		if !slices.Contains(strings.Split(f.config, ";"), want) {
			t.Errorf("function %s has settings %q, without %s", f.name, f.config, want)
		}
	}
	var app int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM public.intents`).Scan(&app); err != nil || app != 1 {
		t.Fatalf("the session's own intents table (public) has %d rows, %v: the test database lacks its application table", app, err)
	}
}

// pgschema.Objects names every table, sequence and function of the
// schema, and nothing else: what Go's SQL can name is what exists.
func TestObjectsAreTheSchemas(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	rows, err := pool.Query(context.Background(), `
		SELECT c.relname FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'S')
		UNION SELECT p.proname FROM pg_proc p WHERE p.pronamespace = $1::regnamespace ORDER BY 1`, testdb.Schema())
	if err != nil {
		t.Fatal(err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	listed := slices.Sorted(slices.Values(pgschema.Objects))
	if !slices.Equal(have, slices.Compact(listed)) {
		t.Fatalf("the schema holds %q; pgschema.Objects lists %q", have, listed)
	}
}

// emptyDatabase is a pool on a new, empty database (testdb.NewEmptyURL).
func emptyDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testdb.NewEmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// An install from before schemas (its tables in public, beside the
// application's) is never given a second, empty install that would hand
// out its epochs again: Up and Installed refuse, naming it. Move takes it
// into a schema of its own in one transaction, data and epochs and the
// namespace on NATS kept, the application's tables left alone, and its
// functions then read the moved tables.
func TestMoveFromPublic(t *testing.T) {
	t.Parallel()
	pool := emptyDatabase(t)
	ctx := context.Background()
	// The application's own function in public: fencegate pins its own
	// functions' search_path, never the application's.
	if _, err := pool.Exec(ctx, `CREATE FUNCTION public.app_total() RETURNS int LANGUAGE sql AS 'SELECT 1'`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, pool, migrations.Config{Schema: "public"}); err != nil {
		t.Fatal(err)
	}
	var appConfig *string
	if err := pool.QueryRow(ctx, `SELECT array_to_string(proconfig, ';') FROM pg_proc WHERE proname = 'app_total'`).Scan(&appConfig); err != nil || appConfig != nil {
		t.Fatalf("the application's function public.app_total has settings %v (%v): fencegate changed it", *appConfig, err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (id int PRIMARY KEY); INSERT INTO invoices VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	old := lease.NewIssuer(pool, lease.WithSchema("public"))
	l, err := old.Acquire(ctx, "r", "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	obOld, err := outbox.New(pool, outbox.Config{Schema: "public"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := obOld.Enqueue(ctx, outbox.Intent{Resource: "r", Epoch: l.Epoch, OperationID: "o", Kind: "email", Payload: json.RawMessage(mail)})
	if err != nil {
		t.Fatal(err)
	}
	var ns string
	if err := pool.QueryRow(ctx, `SELECT namespace FROM public.deployment`).Scan(&ns); err != nil {
		t.Fatal(err)
	}

	const target = "moved_fg"
	var elsewhere *migrations.ElsewhereError
	if _, err := migrations.Up(ctx, pool, migrations.Config{Schema: target}); !errors.As(err, &elsewhere) || elsewhere.Found != "public" {
		t.Fatalf("Up into %s beside an install in public = %v; want *ElsewhereError naming public", target, err)
	}
	if ok, err := migrations.Installed(ctx, pool, target); ok || !errors.As(err, &elsewhere) {
		t.Fatalf("Installed(%s) = %v, %v; want false and *ElsewhereError", target, ok, err)
	}
	var schemaMade bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, target).Scan(&schemaMade); err != nil || schemaMade {
		t.Fatalf("the refused Up created schema %s (%v)", target, err)
	}

	moved, err := migrations.Move(ctx, pool, "public", target)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"intents", "resources", "idempotency_keys", "fencegate_schema_version", "deployment"} {
		if !slices.Contains(moved, want) {
			t.Errorf("moved %q, without %s", moved, want)
		}
	}
	applied, err := migrations.Up(ctx, pool, migrations.Config{Schema: target})
	if err != nil || len(applied) != 0 {
		t.Fatalf("Up after the move = %v, %v; want nothing left to apply", applied, err)
	}
	var left, invoices int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relname = ANY ($1)`, pgschema.Objects).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d of fencegate's relations left in public (%v)", left, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM public.invoices`).Scan(&invoices); err != nil || invoices != 1 {
		t.Fatalf("the application's table: %d rows, %v; want its 1 row untouched", invoices, err)
	}
	var appLeft bool
	if err := pool.QueryRow(ctx, `SELECT to_regprocedure('public.app_total()') IS NOT NULL`).Scan(&appLeft); err != nil || !appLeft {
		t.Fatalf("the application's function left public: %v", err)
	}
	// Epochs go on from where they were; the intent is there.
	iss := lease.NewIssuer(pool, lease.WithSchema(target))
	if l2, err := iss.Acquire(ctx, "r", "A", time.Minute); err != nil || l2.Epoch != l.Epoch+1 {
		t.Fatalf("acquire after the move = %+v, %v; want epoch %d", l2, err, l.Epoch+1)
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: target})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := ob.Get(ctx, res.IntentID); err != nil || r.OperationID != "o" {
		t.Fatalf("the intent after the move: %+v, %v", r, err)
	}
	// The functions read the moved tables, from a session on public.
	var outcome string
	if err := pool.QueryRow(ctx, `SELECT outcome FROM moved_fg.enqueue('r', $1, 'o2', 'email', $2::jsonb)`, l.Epoch+1, mail).Scan(&outcome); err != nil || outcome != "created" {
		t.Fatalf("enqueue after the move = %q, %v", outcome, err)
	}
	var ns2 string
	if err := pool.QueryRow(ctx, `SELECT namespace FROM moved_fg.deployment`).Scan(&ns2); err != nil || ns2 != ns {
		t.Fatalf("namespace after the move = %q, %v; want %q kept (its stream on NATS)", ns2, err, ns)
	}
	// A second move finds the target taken.
	if _, err := migrations.Move(ctx, pool, "public", target); err == nil {
		t.Fatal("a second move into an occupied schema was accepted")
	}
}

// Move refuses, with an InvalidError naming the argument, and creates
// nothing: a from that holds no install (a schema that does not exist,
// or public without one: a typo must not end in a fresh, empty install
// in to), a to that holds an install already (both stay where they are),
// and bad names.
func TestMoveRefusals(t *testing.T) {
	t.Parallel()
	pool := emptyDatabase(t)
	ctx := context.Background()
	move := func(from, to string) func() error {
		return func() error { _, err := migrations.Move(ctx, pool, from, to); return err }
	}
	exists := func(q string, args ...any) bool {
		t.Helper()
		var ok bool
		if err := pool.QueryRow(ctx, q, args...).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	schemaExists := func(name string) bool {
		return exists(`SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name)
	}
	installedIn := func(name string) bool {
		return exists(`SELECT to_regclass($1) IS NOT NULL`, name+".fencegate_schema_version")
	}
	coretest.Refused(t, map[string]func() error{"from": move("nosuch", "moved_to")})
	coretest.Refused(t, map[string]func() error{"from": move("public", "moved_to")})
	coretest.Refused(t, map[string]func() error{"from": move("Bad-Name", "moved_to"), "to": move("public", "Bad-Name")})
	coretest.Refused(t, map[string]func() error{"from": move("moved_to", "moved_to")})
	if schemaExists("moved_to") {
		t.Fatal("a refused Move created its target schema")
	}
	for _, s := range []string{"occupied", "public"} {
		if _, err := migrations.Up(ctx, pool, migrations.Config{Schema: s}); err != nil {
			t.Fatal(err)
		}
	}
	coretest.Refused(t, map[string]func() error{"to": move("public", "occupied")})
	if !installedIn("public") || !installedIn("occupied") {
		t.Errorf("after the refused move: an install in public %t, in occupied %t; want both", installedIn("public"), installedIn("occupied"))
	}
}

// Two schemas of one database are two deployments: epochs of their own,
// notifications on channels of their own, namespaces of their own.
func TestTwoSchemasOneDatabase(t *testing.T) {
	t.Parallel()
	pool := emptyDatabase(t)
	ctx := context.Background()
	for _, s := range []string{"fg_a", "fg_b"} {
		if _, err := migrations.Up(ctx, pool, migrations.Config{Schema: s}); err != nil {
			t.Fatal(err)
		}
	}
	var nsA, nsB string
	if err := pool.QueryRow(ctx, `SELECT (SELECT namespace FROM fg_a.deployment), (SELECT namespace FROM fg_b.deployment)`).Scan(&nsA, &nsB); err != nil {
		t.Fatal(err)
	}
	if nsA == nsB {
		t.Fatalf("both schemas have namespace %s", nsA)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN fg_a_intents; LISTEN fg_b_intents"); err != nil {
		t.Fatal(err)
	}
	a := lease.NewIssuer(pool, lease.WithSchema("fg_a"))
	b := lease.NewIssuer(pool, lease.WithSchema("fg_b"))
	for range 3 {
		if _, err := a.Acquire(ctx, "r", "A", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	lb, err := b.Acquire(ctx, "r", "A", time.Minute)
	if err != nil || lb.Epoch != 1 {
		t.Fatalf("fg_b's first epoch of r = %+v, %v; want 1 (fg_a's are its own)", lb, err)
	}
	obB, err := outbox.New(pool, outbox.Config{Schema: "fg_b", NotifyWindow: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obB.Enqueue(ctx, outbox.Intent{Resource: "r", Epoch: 1, OperationID: "o", Kind: "email", Payload: json.RawMessage(mail)}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(wctx)
	if err != nil || n.Channel != "fg_b_intents" {
		t.Fatalf("notification %+v, %v; want one on fg_b_intents", n, err)
	}
}

// A worker's role granted USAGE on the schema and EXECUTE on the interface
// (docs/sql.md), and nothing on the tables, enqueues and holds leases
// through it, and can neither read nor write fencegate's tables; a role
// without the grant cannot call it.
func TestSQLInterfaceLeastAuthority(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	s := testdb.Schema()
	// Renew is not granted: the worker may call only what it was given.
	worker := testdb.Role(t, pool, "fg_worker_", "GRANT USAGE ON SCHEMA "+s+" TO {role}",
		"GRANT EXECUTE ON FUNCTION "+s+".enqueue(text, bigint, text, text, jsonb, text, text), "+
			s+".acquire(text, text, interval, bigint), "+s+".release(text, text, bigint) TO {role}")
	other := testdb.Role(t, pool, "fg_other_", "GRANT USAGE ON SCHEMA "+s+" TO {role}")
	as := func(role string) *pgx.Conn { return testdb.ConnectAs(t, pool, role) }
	w := as(worker)
	var epoch int64
	if err := w.QueryRow(ctx, testdb.SQL(`SELECT epoch FROM fencegate.acquire('r', 'w', interval '1 minute')`)).Scan(&epoch); err != nil {
		t.Fatalf("acquire as the worker role: %v", err)
	}
	if got, err := sqlEnqueue(ctx, w, enqueueArgs{resource: "r", epoch: epoch, operation: "o", kind: "email", payload: mail}); err != nil || got.Outcome != "created" {
		t.Fatalf("enqueue as the worker role = %+v, %v", got, err)
	}
	for _, stmt := range []string{
		`SELECT count(*) FROM fencegate.intents`,
		`UPDATE fencegate.intents SET status = 'succeeded'`,
		`UPDATE fencegate.resources SET epoch = epoch + 1`,
		`SELECT fencegate.renew('r', 'w', 1, interval '1 minute')`, // not granted
	} {
		_, err := w.Exec(ctx, testdb.SQL(stmt))
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Errorf("%s as the worker role: %v; want insufficient_privilege", stmt, err)
		}
	}
	_, err := sqlEnqueue(ctx, as(other), enqueueArgs{resource: "r", epoch: epoch, operation: "o2", kind: "email", payload: mail})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		t.Errorf("enqueue by a role without EXECUTE: %v; want insufficient_privilege", err)
	}
}

// A grant through SQL waits at most 5 s for the resource's control row
// (lock_timeout, SQLSTATE 55P03: nothing granted), as the Go issuer does;
// an enqueue through SQL records the principal the transaction set.
func TestSQLAcquireBusyAndPrincipal(t *testing.T) {
	t.Parallel()
	pool, iss := sqlSetup(t)
	ctx := context.Background()
	l := acquire(t, iss, "r")
	// A worker's open transaction holds the control row.
	hold, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(context.Background()) }()
	if _, err := hold.Exec(ctx, `SET LOCAL fencegate.principal = 'billing'`); err != nil {
		t.Fatal(err)
	}
	got, err := sqlEnqueue(ctx, hold, enqueueArgs{resource: "r", epoch: l.Epoch, operation: "o", kind: "email", payload: mail})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = pool.Exec(ctx, testdb.SQL(`SELECT fencegate.acquire('r', 'B', interval '1 minute')`))
	waited := time.Since(start)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55P03" || waited < 4*time.Second || waited > 30*time.Second {
		t.Fatalf("acquire while the row is held: %v after %s; want 55P03 after about 5 s", err, waited)
	}
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var principal *string
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT principal FROM fencegate.intents WHERE intent_id = $1`), got.IntentID).Scan(&principal); err != nil || principal == nil || *principal != "billing" {
		t.Fatalf("principal = %v, %v; want billing", principal, err)
	}
	if r, err := iss.Get(ctx, "r"); err != nil || r.Epoch != l.Epoch {
		t.Fatalf("after the refused acquire: %+v, %v; want epoch %d, nothing granted", r, err, l.Epoch)
	}
}

// A refused webhook URL is never echoed: the SQL interface's error (its
// message, detail, hint and context, which also reach the server's log)
// does not hold the URL's query or userinfo (the user name neither), nor
// does the Go intake's (outbox.DefaultKinds, whose rules the admin intake
// and gateway enqueue apply too). Where both refuse for the same reason they say it in the same
// words; where only SQL refuses (its stricter form: an IPv6 literal, a
// character it does not take), it names the field and what it takes.
func TestSQLRefusedURLNotEchoed(t *testing.T) {
	t.Parallel()
	pool, iss := sqlSetup(t)
	ctx := context.Background()
	l := acquire(t, iss, "r")
	const secret = "SQLSECRET-4kP9"
	cases := []struct {
		payload, field string
		same           bool // Go refuses too, in the same words
	}{
		{`{"url":"https://[::1]:18911/x?api_key=` + secret + `","body":{}}`, "payload.url", false},
		{`{"url":"https://api.example.com/x?api_key=` + secret + `&sig=a|b","body":{}}`, "payload.url", false},
		{`{"url":"https://h.example/x y?api_key=` + secret + `"}`, "payload.url", false},
		{`{"url":"http://svcuser:` + secret + `@host/x"}`, "payload.url", true},
		{`{"url":"http://` + secret + `@host/x"}`, "payload.url", true},
		{`{"url":"HTTPS://svcuser:` + secret + `@h.example/x"}`, "payload.url", true},
		{`{"url":"https://svcuser:` + secret + `@h.example/x?api_key=` + secret + `#frag"}`, "payload.url", true},
		{`{"url":"https://h.example/x?api_key=` + secret + `#frag"}`, "payload.url", true},
		{`{"url":"ftp://svcuser:` + secret + `@h.example/x"}`, "payload.url", true},
		{`{"url":"svcuser:` + secret + `@h.example/x"}`, "payload.url", true},
		{`{"url":"http://svcuser:` + secret + `@/x"}`, "payload.url", true},
		{`{"url":"https://h.example/x","lookup_url":"https://h.example/l?token=` + secret + `|x"}`, "payload.lookup_url", false},
		{`{"url":"https://h.example/x","lookup_url":"http://svcuser:` + secret + `@h.example/l"}`, "payload.lookup_url", true},
	}
	for i, c := range cases {
		_, err := sqlEnqueue(ctx, pool, enqueueArgs{resource: "r", epoch: l.Epoch, operation: fmt.Sprintf("url-%d", i), kind: "webhook", payload: c.payload})
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "ZF004" || pe.ColumnName != c.field {
			t.Errorf("SQL %s: %v; want ZF004 naming %s", c.payload, err, c.field)
			continue
		}
		if all := strings.Join([]string{pe.Message, pe.Detail, pe.Hint, pe.Where}, "\n"); strings.Contains(all, secret) || strings.Contains(all, "svcuser") {
			t.Errorf("SQL %s: the error echoes the URL: %s", c.payload, all)
		}
		goErr := outbox.DefaultKinds()["webhook"].Check(json.RawMessage(c.payload))
		switch {
		case goErr != nil && (strings.Contains(goErr.Error(), secret) || strings.Contains(goErr.Error(), "svcuser")):
			t.Errorf("Go %s: the error echoes the URL: %v", c.payload, goErr)
		case c.same && (goErr == nil || goErr.Error() != pe.Message):
			t.Errorf("%s: Go says %v, SQL %q; want the same words", c.payload, goErr, pe.Message)
		}
	}
	t.Logf("%d refused URLs checked", len(cases))
	if len(cases) == 0 {
		t.Fatal("no URL checked")
	}
}
