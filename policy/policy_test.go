package policy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
	"github.com/fencegate/fencegate/policy"
)

func TestMain(m *testing.M) { testdb.Main(m) }

const mail = `{"to":"alice@example.com","from":"reports@example.com","subject":"Nightly report","text":"ready"}`

// sqlState returns the SQLSTATE, COLUMN and DETAIL of err ("" if none).
func sqlState(err error) (code, column, detail string) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code, pe.ColumnName, pe.Detail
	}
	return "", "", ""
}

// A rule set confines what a SQL role can do through the interface: a
// role mapped to a principal confined to reports/* and email can acquire,
// renew, release and enqueue there, and nothing else — each refusal is
// ZF007 naming the field, before the resource's control row is created
// or locked and without its epoch or holder; a role mapped to nothing is
// ZF006 naming the role; the intent records the mapped principal, not one
// the caller declared; keys are scoped per resource without ambiguity.
// Before any rule set is applied, roles use the interface as before.
func TestSQLRolesFollowTheRuleSet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	reportsRole, billingRole, stranger := testdb.Role(t, pool, "fg_reports_", testdb.WorkerGrants()...),
		testdb.Role(t, pool, "fg_billing_", testdb.WorkerGrants()...), testdb.Role(t, pool, "fg_stranger_", testdb.WorkerGrants()...)
	w := map[string]*pgx.Conn{}
	for _, r := range []string{reportsRole, billingRole, stranger} {
		w[r] = testdb.ConnectAs(t, pool, r)
	}
	q := func(sql string) string { return testdb.SQL(sql) }
	acquire := func(c *pgx.Conn, resource string) (int64, error) {
		var epoch int64
		err := c.QueryRow(ctx, q(`SELECT epoch FROM fencegate.acquire($1, 'h', interval '1 minute')`), resource).Scan(&epoch)
		return epoch, err
	}
	enqueue := func(c *pgx.Conn, resource string, epoch int64, op, kind, payload string, key *string) (int64, error) {
		var id int64
		err := c.QueryRow(ctx, q(`SELECT intent_id FROM fencegate.enqueue($1, $2, $3, $4, $5::jsonb, $6)`),
			resource, epoch, op, kind, payload, key).Scan(&id)
		return id, err
	}
	checks := 0
	expect := func(what string, err error, code, column string) {
		t.Helper()
		checks++
		got, col, detail := sqlState(err)
		if got != code || col != column {
			t.Errorf("%s: %v (SQLSTATE %q, COLUMN %q); want SQLSTATE %s naming %q", what, err, got, col, code, column)
		}
		if code == "ZF007" && (strings.Contains(detail, "epoch") || strings.Contains(detail, "holder")) {
			t.Errorf("%s: the refusal's DETAIL %s tells the resource's epoch or holder", what, detail)
		}
	}

	// No rule set yet: as before, any granted role.
	if _, err := acquire(w[stranger], "billing/eu"); err != nil {
		t.Fatalf("acquire before any rule set: %v", err)
	}

	doc, err := policy.Parse([]byte(fmt.Sprintf(`{"principals": [
		{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"], "sql_roles": [%q]},
		{"name": "billing", "role": "worker", "resources": ["billing*"], "kinds": ["*"], "key_scope": "global", "sql_roles": [%q]}]}`,
		reportsRole, billingRole)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Apply(ctx, pool, testdb.Schema(), doc); err != nil {
		t.Fatal(err)
	}

	r := w[reportsRole]
	epoch, err := acquire(r, "reports/daily")
	if err != nil {
		t.Fatalf("acquire reports/daily as the reports principal: %v", err)
	}
	// A principal the caller declares is not the one recorded.
	if _, err := r.Exec(ctx, `SELECT set_config('fencegate.principal', 'billing', false)`); err != nil {
		t.Fatal(err)
	}
	id, err := enqueue(r, "reports/daily", epoch, "op-1", "email", mail, nil)
	if err != nil {
		t.Fatalf("enqueue email on reports/daily: %v", err)
	}
	var principal, key string
	if err := pool.QueryRow(ctx, q(`SELECT principal, idempotency_key FROM fencegate.intents WHERE intent_id = $1`), id).Scan(&principal, &key); err != nil {
		t.Fatal(err)
	}
	checks++
	if principal != "reports" || key != "13:reports/daily/op-1" {
		t.Errorf("intent %d: principal %q, key %q; want the mapped principal reports and the scoped key 13:reports/daily/op-1", id, principal, key)
	}
	if _, err := r.Exec(ctx, q(`SELECT fencegate.renew('reports/daily', 'h', $1, interval '1 minute')`), epoch); err != nil {
		t.Errorf("renew reports/daily: %v", err)
	}

	// Nested names: the same key under "reports/a" and "reports/a/eu" is
	// two keys, whatever the key holds.
	var ids []int64
	for _, c := range []struct{ resource, key string }{{"reports/a", "eu/x"}, {"reports/a/eu", "x"}} {
		e, err := acquire(r, c.resource)
		if err != nil {
			t.Fatal(err)
		}
		id, err := enqueue(r, c.resource, e, "op-nested", "email", mail, &c.key)
		if err != nil {
			t.Fatalf("enqueue on %s with key %s: %v", c.resource, c.key, err)
		}
		ids = append(ids, id)
	}
	checks++
	if ids[0] == ids[1] {
		t.Errorf("reports/a + eu/x and reports/a/eu + x are one intent (%d): the scoped keys collide", ids[0])
	}

	// A principal of the global scope cannot take a scoped key: the
	// reports mail's key, given literally on billing, is refused.
	be, err := acquire(w[billingRole], "billing")
	if err != nil {
		t.Fatal(err)
	}
	squat := "13:reports/daily/op-2"
	_, err = enqueue(w[billingRole], "billing", be, "op-squat", "email", mail, &squat)
	expect("a global-scope key in a scoped key's form", err, "ZF004", "idempotency_key")
	plain := "2024:invoice/7"
	if _, err := enqueue(w[billingRole], "billing", be, "op-plain", "email", mail, &plain); err != nil {
		t.Errorf("a global key %q that only starts like a scoped one: %v", plain, err)
	}

	// Outside its scope: nothing, and no control row made or locked.
	_, err = acquire(r, "billing/eu")
	expect("acquire billing/eu", err, "ZF007", "resource")
	_, err = r.Exec(ctx, q(`SELECT fencegate.renew('billing/eu', 'h', 1, interval '1 minute')`))
	expect("renew billing/eu", err, "ZF007", "resource")
	_, err = r.Exec(ctx, q(`SELECT fencegate.release('billing/eu', 'h', 1)`))
	expect("release billing/eu", err, "ZF007", "resource")
	_, err = enqueue(r, "billing/eu", 1, "op-2", "email", mail, nil)
	expect("enqueue on billing/eu", err, "ZF007", "resource")
	_, err = acquire(r, "reportsX")
	expect("acquire reportsX (not under reports/)", err, "ZF007", "resource")
	_, err = enqueue(r, "reports/daily", epoch, "op-3", "file", `{"path":"x.txt","content":"x"}`, nil)
	expect("enqueue a file", err, "ZF007", "kind")
	var rows int
	if err := pool.QueryRow(ctx, q(`SELECT count(*) FROM fencegate.resources WHERE resource_id = 'reportsX'`)).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("a refused acquire made %d control rows (%v)", rows, err)
	}

	// A role mapped to no principal: nothing, naming the role.
	_, err = acquire(w[stranger], "reports/daily")
	expect("acquire by an unmapped role", err, "ZF006", "role")
	_, err = enqueue(w[stranger], "reports/daily", epoch, "op-4", "email", mail, nil)
	expect("enqueue by an unmapped role", err, "ZF006", "role")

	var stored int
	if err := pool.QueryRow(ctx, q(`SELECT count(*) FROM fencegate.intents`)).Scan(&stored); err != nil || stored != 4 {
		t.Errorf("%d intents stored (%v); want the 4 allowed", stored, err)
	}
	if checks < 10 {
		t.Fatalf("only %d checks ran", checks)
	}
	t.Logf("%d checks of the rule set through SQL", checks)
}

// A worker's transaction that holds a resource's control row (an enqueue
// not yet committed) and then idles stalls the holder's renewals only as
// long as its role's idle_in_transaction_session_timeout (docs/sql.md's
// grant block sets one): the server ends that session, its transaction
// and the intent with it, and the renew, waiting within its lock timeout
// (5 s), goes through instead of failing busy (55P03).
func TestIdleWorkerStallsRenewOnlyUntilItsTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	worker := testdb.Role(t, pool, "fg_idle_", testdb.WorkerGrants()...)
	q := func(sql string) string { return testdb.SQL(sql) }
	if _, err := pool.Exec(ctx, "ALTER ROLE "+worker+" SET idle_in_transaction_session_timeout = '1s'"); err != nil {
		t.Fatal(err)
	}
	// The setting applies to sessions that start after it.
	w := testdb.ConnectAs(t, pool, worker)

	var epoch int64
	if err := pool.QueryRow(ctx, q(`SELECT epoch FROM fencegate.acquire('shared', 'holder', interval '1 minute')`)).Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	tx, err := w.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, q(`SELECT * FROM fencegate.enqueue('shared', $1, 'op', 'email', $2::jsonb)`), epoch, mail); err != nil {
		t.Fatalf("the worker's enqueue: %v", err)
	}
	// The worker now idles in its transaction, holding the control row.
	if _, err := pool.Exec(ctx, q(`SELECT fencegate.renew('shared', 'holder', $1, interval '1 minute')`), epoch); err != nil {
		t.Fatalf("the holder's renew behind an idle worker: %v; want it through once the worker's session is ended", err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the idle worker's transaction committed after its session should have been ended")
	}
	var n int
	if err := pool.QueryRow(ctx, q(`SELECT count(*) FROM fencegate.intents`)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d intents stored (%v); want none: the ended transaction's enqueue is gone", n, err)
	}
	t.Logf("renew went through; the idle transaction was ended and stored %d intents", n)
}

// A bad document is refused naming the field; a good one gets its
// defaults (key scope resource).
func TestParse(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ doc, field string }{
		{`{"principals": [{"name": "Reports", "role": "worker", "resources": ["*"], "kinds": ["*"]}]}`, "principals[0].name"},
		{`{"principals": [{"name": "r", "role": "admin", "resources": ["*"], "kinds": ["*"]}]}`, "principals[0].role"},
		{`{"principals": [{"name": "r", "role": "worker", "kinds": ["*"]}]}`, "principals[0].resources"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"]}]}`, "principals[0].kinds"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["a*b"], "kinds": ["*"]}]}`, "principals[0].resources[0]"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["a\u202eb"], "kinds": ["*"]}]}`, "principals[0].resources[0]"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["em*"]}]}`, "principals[0].kinds[0]"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"], "key_scope": "tenant"}]}`, "principals[0].key_scope"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"], "sql_roles": ["Bad Role"]}]}`, "principals[0].sql_roles[0]"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"], "sql_roles": ["w"]},
			{"name": "s", "role": "worker", "resources": ["*"], "kinds": ["*"], "sql_roles": ["w"]}]}`, "principals[1].sql_roles[0]"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"]},
			{"name": "r", "role": "operator", "resources": ["*"]}]}`, "principals[1].name"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"], "token": "x"}]}`, "principals[0].token"},
		{`{"principals": [{"name": 7}]}`, "principals[0].name"},
		{`{"principal": []}`, "principal"},
		{`{"principals": []} {}`, "document"},
		// No principal: every way in refused (a rule set stays in force).
		{`{}`, "principals"},
		{`{"principals": []}`, "principals"},
		{`{"principals": null, "destinations": {"webhook": {"hosts": ["h.example.com"]}}}`, "principals"},
		{`not json`, "document"},
	} {
		_, err := policy.Parse([]byte(c.doc))
		var ie *fenceerr.InvalidError
		if !errors.As(err, &ie) || ie.Field != c.field {
			t.Errorf("Parse(%s) = %v; want an invalid-input error naming %s", c.doc, err, c.field)
		}
	}
	// YAML reads as the JSON it spells, with the same errors.
	y, err := policy.Parse([]byte("principals:\n  - name: reports\n    role: worker\n    resources: [\"reports/*\"]\n    kinds: [email]\n" +
		"destinations:\n  webhook:\n    hosts: [hooks.example.com]\n"))
	if err != nil || len(y.Principals) != 1 || y.Principals[0].Resources[0] != "reports/*" || y.Destinations.Webhook == nil {
		t.Fatalf("a YAML document: %+v, %v", y, err)
	}
	var ie *fenceerr.InvalidError
	if _, err := policy.Parse([]byte("principals:\n  - name: r\n    role: worker\n    resources: [\"*\"]\n    kinds: [\"*\"]\n    sql_role: [w]\n")); !errors.As(err, &ie) || ie.Field != "principals[0].sql_role" {
		t.Errorf("a YAML document with a misspelt field: %v; want it refused naming principals[0].sql_role", err)
	}
	if _, err := policy.Parse([]byte("principals: [\n")); !errors.As(err, &ie) || ie.Field != "document" {
		t.Errorf("neither JSON nor YAML: %v; want it refused naming document", err)
	}
	// A webhook host given as a URL with credentials is refused naming
	// its position, never echoed (it was quoted whole: "got %q").
	const secret = "POLICYSECRET-9x"
	if _, err := policy.Parse([]byte(`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"]}],
		"destinations": {"webhook": {"hosts": ["ok.example", "https://u:` + secret + `@h.example/x"]}}}`)); !errors.As(err, &ie) ||
		ie.Field != "destinations.webhook.hosts[1]" || strings.Contains(err.Error(), secret) {
		t.Errorf("a host given as a URL with a password: %v; want it refused naming destinations.webhook.hosts[1], not echoed", err)
	}
	d, err := policy.Parse([]byte(`{"principals": [{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if p := d.Principals[0]; p.KeyScope != policy.KeyScopeResource {
		t.Errorf("default key scope = %q; want %q", p.KeyScope, policy.KeyScopeResource)
	}
}

func TestAllows(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pattern, resource string
		want              bool
	}{
		{"*", "anything", true},
		{"reports/*", "reports/daily", true},
		{"reports/*", "reports", false},
		{"reports/*", "reportsX", false},
		{"billing", "billing", true},
		{"billing", "billing/eu", false},
	} {
		if got := policy.Allows(c.pattern, c.resource); got != c.want {
			t.Errorf("Allows(%q, %q) = %t; want %t", c.pattern, c.resource, got, c.want)
		}
	}
}

// The rule set's destinations hold on the SQL interface and on the Go
// client alike, whoever enqueues (no principals here): each kind's payload
// outside its rules is refused as invalid input naming the field, one
// inside is accepted; a kind without rules is not confined.
func TestDestinations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	var me string
	if err := pool.QueryRow(ctx, `SELECT session_user`).Scan(&me); err != nil {
		t.Fatal(err)
	}
	doc, err := policy.Parse([]byte(`{"principals": [{"name": "any", "role": "worker", "resources": ["*"], "kinds": ["*"], "key_scope": "global", "sql_roles": ["` + me + `"]}],
		"destinations": {
			"email": {"senders": ["reports@example.com", "billing.example.com"], "recipient_domains": ["example.com"]},
			"webhook": {"hosts": ["hooks.example.com", "billing.internal:8443", "10.1.2.3:9000"]},
			"file": {"targets": ["reports/*.txt", "archive/**"]},
			"s3": {"buckets": ["reports"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Apply(ctx, pool, testdb.Schema(), doc); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema(), Principal: "any"})
	if err != nil {
		t.Fatal(err)
	}
	iss := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()), lease.AsPrincipal("any"))
	l, err := iss.Acquire(ctx, "d", "h", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ kind, payload, field string }{
		{"email", `{"to":["a@example.com"],"from":"reports@example.com","subject":"s","text":"t"}`, ""},
		{"email", `{"to":["a@example.com"],"from":"Billing <x@billing.example.com>","subject":"s","text":"t"}`, ""},
		{"email", `{"to":["a@example.com"],"from":"ceo@example.com","subject":"s","text":"t"}`, "payload.from"},
		{"email", `{"to":["a@example.com"],"from":"x@sub.billing.example.com","subject":"s","text":"t"}`, "payload.from"},
		{"email", `{"to":["a@example.com"],"cc":["b@example.com","c@evil.example"],"from":"reports@example.com","subject":"s","text":"t"}`, "payload.cc[1]"},
		{"webhook", `{"url":"https://hooks.example.com/x"}`, ""},
		{"webhook", `{"url":"https://HOOKS.example.com.:8443/x"}`, ""},
		{"webhook", `{"url":"https://billing.internal:8443/x"}`, ""},
		{"webhook", `{"url":"https://billing.internal/x"}`, "payload.url"},
		{"webhook", `{"url":"http://10.1.2.3:9000/x"}`, ""},
		{"webhook", `{"url":"http://10.1.2.3:9001/x"}`, "payload.url"},
		{"webhook", `{"url":"https://evil.example/x"}`, "payload.url"},
		{"webhook", `{"url":"https://hooks.example.com/x","lookup_url":"https://evil.example/l"}`, "payload.lookup_url"},
		{"file", `{"target":"reports/a.txt","content":"x"}`, ""},
		{"file", `{"target":"archive/2026/12/a.bin","content":"x"}`, ""},
		{"file", `{"target":"reports/sub/a.txt","content":"x"}`, "payload.target"},
		{"file", `{"target":"reports/a.csv","content":"x"}`, "payload.target"},
		{"file", `{"target":"reportsXa.txt","content":"x"}`, "payload.target"},
		{"s3", `{"key":"a","content":"x"}`, ""},
		{"s3", `{"bucket":"reports","key":"a","content":"x"}`, ""},
		{"s3", `{"bucket":"other","key":"a","content":"x"}`, "payload.bucket"},
	}
	checked := 0
	for i, c := range cases {
		_, goErr := ob.Enqueue(ctx, outbox.Intent{Resource: "d", Epoch: l.Epoch, OperationID: fmt.Sprintf("go-%d", i), Kind: c.kind, Payload: json.RawMessage(c.payload)})
		_, sqlErr := pool.Exec(ctx, testdb.SQL(`SELECT * FROM fencegate.enqueue('d', $1, $2, $3, $4::jsonb)`), l.Epoch, fmt.Sprintf("sql-%d", i), c.kind, c.payload)
		for way, err := range map[string]error{"Go": goErr, "SQL": sqlErr} {
			checked++
			got := ""
			var ie *fenceerr.InvalidError
			var pe *pgconn.PgError
			switch {
			case errors.As(err, &ie):
				got = ie.Field
			case errors.As(err, &pe) && pe.Code == "ZF004":
				got = pe.ColumnName
			case err != nil:
				got = "error: " + err.Error()
			}
			if got != c.field {
				t.Errorf("%s: %s %s: %q; want %q", way, c.kind, c.payload, got, c.field)
			}
		}
	}
	if checked != 2*len(cases) {
		t.Fatalf("%d of %d enqueues checked", checked, 2*len(cases))
	}
	t.Logf("%d enqueues checked against the destinations (Go and SQL)", checked)
}

// The rule set's webhook hosts refuse a URL outside them naming its host
// at most, never its userinfo or query: through a Go client whose own
// "webhook" kind checks nothing (the rule still holds: fencegate_enqueue
// applies it) and through fencegate_rules called directly.
func TestWebhookDestinationRefusalNotEchoed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	var me string
	if err := pool.QueryRow(ctx, `SELECT session_user`).Scan(&me); err != nil {
		t.Fatal(err)
	}
	doc, err := policy.Parse([]byte(`{"principals": [{"name": "any", "role": "worker", "resources": ["*"], "kinds": ["*"], "key_scope": "global", "sql_roles": ["` + me + `"]}],
		"destinations": {"webhook": {"hosts": ["hooks.example.com"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Apply(ctx, pool, testdb.Schema(), doc); err != nil {
		t.Fatal(err)
	}
	anything := outbox.KindSpec{DefaultFence: outbox.FenceCommit, Check: func(json.RawMessage) error { return nil }}
	ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema(), Principal: "any", Kinds: map[string]outbox.KindSpec{"webhook": anything}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()), lease.AsPrincipal("any")).Acquire(ctx, "d", "h", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "RULESECRET-8vN2"
	checked := 0
	for i, c := range []struct{ payload, field, names string }{
		{`{"url":"https://svcuser:` + secret + `@hooks.example.com/x"}`, "payload.url", ""},
		{`{"url":"https://svcuser:` + secret + `@evil.example/x"}`, "payload.url", ""},
		{`{"url":"https://evil.example/x?api_key=` + secret + `"}`, "payload.url", "evil.example"},
		{`{"url":"svcuser:` + secret + `@evil.example/x"}`, "payload.url", ""},
		{`{"url":"https://hooks.example.com/x","lookup_url":"https://evil.example:8443/l?token=` + secret + `"}`, "payload.lookup_url", "evil.example"},
	} {
		_, goErr := ob.Enqueue(ctx, outbox.Intent{Resource: "d", Epoch: l.Epoch, OperationID: fmt.Sprintf("go-%d", i), Kind: "webhook", Payload: json.RawMessage(c.payload)})
		_, sqlErr := pool.Exec(ctx, testdb.SQL(`SELECT fencegate.fencegate_rules('d', 'webhook', 'o', NULL, $1::jsonb)`), c.payload)
		for way, err := range map[string]error{"Go client": goErr, "fencegate_rules": sqlErr} {
			checked++
			var ie *fenceerr.InvalidError
			var pe *pgconn.PgError
			text := ""
			switch {
			case errors.As(err, &ie) && ie.Field == c.field:
				text = ie.Error()
			case errors.As(err, &pe) && pe.Code == "ZF004" && pe.ColumnName == c.field:
				text = strings.Join([]string{pe.Message, pe.Detail, pe.Hint}, "\n")
			default:
				t.Errorf("%s %s: %v; want invalid input naming %s", way, c.payload, err, c.field)
				continue
			}
			if strings.Contains(text, secret) || strings.Contains(text, "svcuser") || !strings.Contains(text, c.names) {
				t.Errorf("%s %s: %q; want it to name %q at most, never the URL's userinfo or query", way, c.payload, text, c.names)
			}
		}
	}
	t.Logf("%d refusals checked", checked)
	if checked == 0 {
		t.Fatal("no refusal checked")
	}
}

// A Go worker whose role was granted fencegate's tables before the rule
// set's tables existed (GRANT … ON ALL TABLES covers only the tables there
// at the time) still enqueues and grants after the upgrade: the rule set is
// read with the owner's rights, never the caller's.
func TestWorkerGrantedTheOlderTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	s := testdb.Schema()
	var grants []string
	for _, tbl := range []string{"intents", "resources", "idempotency_keys", "intent_events", "epoch_grants", "epoch_authority", "deployment"} {
		grants = append(grants, "GRANT ALL ON TABLE "+s+"."+tbl+" TO {role}")
	}
	grants = append(grants, "GRANT USAGE ON SCHEMA "+s+" TO {role}", "GRANT USAGE ON ALL SEQUENCES IN SCHEMA "+s+" TO {role}")
	role := testdb.Role(t, pool, "fg_gowork_", grants...)
	cfg := pool.Config().Copy()
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, testdb.RolePassword
	wpool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wpool.Close)
	for _, applied := range []bool{false, true} {
		if applied {
			doc, err := policy.Parse([]byte(`{"principals": [{"name": "w", "role": "worker", "resources": ["*"], "kinds": ["*"], "key_scope": "global"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := policy.Apply(ctx, pool, s, doc); err != nil {
				t.Fatal(err)
			}
		}
		iss := lease.NewIssuer(wpool, lease.WithSchema(s), lease.AsPrincipal("w"))
		l, err := iss.Acquire(ctx, fmt.Sprintf("r-%t", applied), "h", time.Minute)
		if err != nil {
			t.Fatalf("rule set applied %t: acquire as a role granted the older tables: %v", applied, err)
		}
		ob, err := outbox.New(wpool, outbox.Config{Schema: s, Principal: "w"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Enqueue(ctx, outbox.Intent{Resource: l.Resource, Epoch: l.Epoch, OperationID: "op", Kind: "email", Payload: json.RawMessage(mail)}); err != nil {
			t.Fatalf("rule set applied %t: enqueue as a role granted the older tables: %v", applied, err)
		}
		if _, err := ob.EnqueueBatch(ctx, []outbox.Intent{{Resource: l.Resource, Epoch: l.Epoch, OperationID: "op2", Kind: "email", Payload: json.RawMessage(mail)}}); err != nil {
			t.Fatalf("rule set applied %t: batch enqueue as a role granted the older tables: %v", applied, err)
		}
	}
}

// What the SQL interface decides with its owner's rights depends on
// nothing a worker's session can set, and a worker confined to some
// resources cannot steer what happens to the others: (1) the database's
// system identifier, which the epoch authority check compares with the
// one on record (ZF001 on a copy), is read from the server, not from a
// session setting the caller could set first; (2) the failover jump,
// which the first grant after a promotion applies to every resource's
// epoch, can be chosen (other than the default) only by a principal
// allowed to advance epochs, the right that moving epochs needs.
func TestSQLWorkerCannotSteerTheEpochAuthority(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	q := func(sql string) string { return testdb.SQL(sql) }
	reportsRole, opsRole := testdb.Role(t, pool, "fg_reports_", testdb.WorkerGrants()...),
		testdb.Role(t, pool, "fg_ops_", testdb.WorkerGrants()...)
	doc, err := policy.Parse([]byte(fmt.Sprintf(`{"principals": [
		{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"], "sql_roles": [%q]},
		{"name": "ops", "role": "worker", "resources": ["ops/*"], "kinds": ["email"], "epochs": true, "sql_roles": [%q]}]}`,
		reportsRole, opsRole)))
	if err != nil {
		t.Fatal(err)
	}
	// Another team's resource, granted before the rule set (the test's
	// own role is mapped to no principal).
	iss := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()))
	if _, err := iss.Acquire(ctx, "billing/1", "bw", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Apply(ctx, pool, testdb.Schema(), doc); err != nil {
		t.Fatal(err)
	}
	billingEpoch := func() int64 {
		t.Helper()
		b, err := iss.Get(ctx, "billing/1")
		if err != nil {
			t.Fatal(err)
		}
		return b.Epoch
	}
	reports, ops := testdb.ConnectAs(t, pool, reportsRole), testdb.ConnectAs(t, pool, opsRole)
	acquire := func(c *pgx.Conn, resource string, jump *int64) (int64, error) {
		var epoch int64
		err := c.QueryRow(ctx, q(`SELECT epoch FROM fencegate.acquire($1, 'h', interval '1 minute', coalesce($2::bigint, 1000000))`), resource, jump).Scan(&epoch)
		return epoch, err
	}
	var realID int64
	if err := pool.QueryRow(ctx, `SELECT system_identifier FROM pg_control_system()`).Scan(&realID); err != nil {
		t.Fatal(err)
	}
	recorded := func() (id int64, rows int) {
		t.Helper()
		if err := pool.QueryRow(ctx, q(`SELECT coalesce(max(system_identifier), 0), count(*) FROM fencegate.epoch_authority`)).Scan(&id, &rows); err != nil {
			t.Fatal(err)
		}
		return id, rows
	}
	checks := 0
	expect := func(what string, err error, code, column string) {
		t.Helper()
		checks++
		if got, col, _ := sqlState(err); got != code || col != column {
			t.Errorf("%s: %v (SQLSTATE %q, COLUMN %q); want SQLSTATE %s naming %q", what, err, got, col, code, column)
		}
	}

	// (1) The database on record is another one (a copy): the worker's
	// session names that one's identifier first, and is refused anyway.
	if _, err := pool.Exec(ctx, q(`UPDATE fencegate.epoch_authority SET system_identifier = 42`)); err != nil {
		t.Fatal(err)
	}
	if _, err := reports.Exec(ctx, `SET fencegate.system_identifier = '42'`); err != nil {
		t.Fatal(err)
	}
	_, err = acquire(reports, "reports/copy", nil)
	expect("acquire on a copy, the session naming the recorded identifier", err, "ZF001", "")
	// No record (an operator's DELETE, as guarantees.md says to accept a
	// moved database): the grant records the server's identifier, not the
	// session's.
	if _, err := pool.Exec(ctx, q(`DELETE FROM fencegate.epoch_authority`)); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(reports, "reports/record", nil); err != nil {
		t.Fatalf("acquire after the record was deleted: %v", err)
	}
	checks++
	if id, rows := recorded(); id != realID || rows != 1 {
		t.Errorf("epoch_authority records identifier %d (%d rows); want the server's %d, not the session's 42", id, rows, realID)
	}

	// (2) No record again: a confined worker's grant would be the first
	// after the "promotion". A jump other than the default is refused,
	// naming it, and nothing changes; the default applies as it must.
	if _, err := pool.Exec(ctx, q(`DELETE FROM fencegate.epoch_authority`)); err != nil {
		t.Fatal(err)
	}
	if _, err := reports.Exec(ctx, `RESET fencegate.system_identifier`); err != nil {
		t.Fatal(err)
	}
	before := billingEpoch()
	for _, jump := range []int64{lease.MaxEpoch - 1000, 0, 7} {
		_, err := acquire(reports, "reports/b", &jump)
		expect(fmt.Sprintf("a confined worker's acquire with failover_epoch_jump %d", jump), err, "ZF007", "failover_epoch_jump")
	}
	checks++
	if _, rows := recorded(); rows != 0 {
		t.Errorf("a refused jump recorded the authority (%d rows)", rows)
	}
	if e := billingEpoch(); e != before {
		t.Errorf("billing/1 after refused jumps: epoch %d; want %d", e, before)
	}
	def := lease.DefaultFailoverEpochJump
	if _, err := acquire(reports, "reports/b", &def); err != nil {
		t.Fatalf("a confined worker's acquire with the default jump: %v", err)
	}
	checks++
	if e := billingEpoch(); e != before+def {
		t.Errorf("billing/1 after the default jump: epoch %d; want %d", e, before+def)
	}
	// A principal allowed to advance epochs may choose the jump.
	if _, err := pool.Exec(ctx, q(`DELETE FROM fencegate.epoch_authority`)); err != nil {
		t.Fatal(err)
	}
	jump := int64(5)
	if _, err := acquire(ops, "ops/x", &jump); err != nil {
		t.Fatalf("acquire with failover_epoch_jump 5 by a principal with epochs: %v", err)
	}
	checks++
	if e := billingEpoch(); e != before+def+jump {
		t.Errorf("billing/1 after the ops principal's jump: epoch %d; want %d", e, before+def+jump)
	}
	if checks < 8 {
		t.Fatalf("only %d checks ran", checks)
	}
	t.Logf("%d checks of what a worker's session can steer", checks)
}

// Apply and Current refuse a nil pool, naming it (Apply panicked on a nil
// pointer).
func TestNilPoolRefused(t *testing.T) {
	t.Parallel()
	d, err := policy.Parse([]byte(`{"principals":[{"name":"reports","role":"worker","resources":["reports/*"],"kinds":["email"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	coretest.Refused(t, map[string]func() error{"pool": func() error { _, err := policy.Apply(ctx, nil, testdb.Schema(), d); return err }})
	coretest.Refused(t, map[string]func() error{"pool": func() error { _, _, err := policy.Current(ctx, nil, testdb.Schema()); return err }})
}

// A rule set decides authority, so Apply commits it durably whatever the
// session's synchronous_commit: here a pool whose sessions run with it off
// (no gateway pool's session setting), and a trigger that records the
// setting in force inside Apply's transaction. It ran with the session's
// (off), durable behind a pooler only by luck of the server connection.
func TestApplyIsDurable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := testdb.New(t)
	if _, err := base.Exec(ctx, testdb.SQL(`
		CREATE TABLE public.commit_settings (setting text);
		CREATE FUNCTION public.record_commit_setting() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO public.commit_settings VALUES (current_setting('synchronous_commit'));
			RETURN NEW;
		END $$;
		CREATE TRIGGER record_commit_setting BEFORE INSERT ON fencegate.policy_history
			FOR EACH ROW EXECUTE FUNCTION public.record_commit_setting();`)); err != nil {
		t.Fatal(err)
	}
	cfg := base.Config().Copy()
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := policy.Parse([]byte(`{"principals":[{"name":"reports","role":"worker","resources":["reports/*"],"kinds":["email"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Apply(ctx, pool, testdb.Schema(), d); err != nil {
		t.Fatal(err)
	}
	var setting string
	if err := base.QueryRow(ctx, `SELECT setting FROM public.commit_settings`).Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if setting != "on" && setting != "remote_write" && setting != "remote_apply" {
		t.Fatalf("Apply committed with synchronous_commit = %s, want on (or stronger)", setting)
	}
}

// The rule set's checks that Go callers use (fencegate_check_principal,
// fencegate_rules; callable by any role) take the principal a session
// names in fencegate.principal only from a role that could write
// fencegate's tables itself (the gateway's, a Go worker's). A role that
// reaches fencegate through the SQL interface alone, mapped to no
// principal, gets ZF006: it named another principal and learnt that
// principal's scope and which webhook hosts its rules allow.
func TestUnmappedRoleCannotNameAPrincipal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	stranger := testdb.Role(t, pool, "fg_prober_", testdb.WorkerGrants()...)
	doc, err := policy.Parse([]byte(`{"principals": [
		{"name": "billing", "role": "worker", "resources": ["billing*"], "kinds": ["*"], "key_scope": "global"}],
		"destinations": {"webhook": {"hosts": ["hooks.example.com"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Apply(ctx, pool, testdb.Schema(), doc); err != nil {
		t.Fatal(err)
	}
	probes := map[string]string{
		"check_principal": `SELECT fencegate.fencegate_check_principal('billing/x', 'email', false)`,
		"rules":           `SELECT fencegate.fencegate_rules('billing/x', 'webhook', 'op', 'k', '{"url": "https://hooks.example.com/x"}')`,
	}
	c := testdb.ConnectAs(t, pool, stranger)
	if _, err := c.Exec(ctx, `SELECT set_config('fencegate.principal', 'billing', false)`); err != nil {
		t.Fatal(err)
	}
	for name, sql := range probes {
		var out string
		err := c.QueryRow(ctx, testdb.SQL(sql)).Scan(&out)
		if code, _, _ := sqlState(err); code != "ZF006" {
			t.Errorf("%s as an unmapped interface role naming billing: %q, %v; want ZF006 (no principal)", name, out, err)
		}
	}
	// The gateway's own role (it owns the tables) names its principal so.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT set_config('fencegate.principal', 'billing', false)`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `SELECT set_config('fencegate.principal', '', false)`)
	for name, sql := range probes {
		var out string
		if err := conn.QueryRow(ctx, testdb.SQL(sql)).Scan(&out); err != nil {
			t.Errorf("%s as the gateway's role naming billing: %v", name, err)
		}
	}
}
