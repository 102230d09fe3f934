package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
	"github.com/fencegate/fencegate/policy"
)

// gateway policy apply FILE stores a rule set (exit 0, its version), a bad
// one is exit 2 naming the field with nothing stored; gateway policy show
// prints the one in force (version 0 and no document before any).
func TestPolicyApplyShow(t *testing.T) {
	t.Parallel()
	db := testdb.NewURL(t)
	expectCode(t, gw(t, db, "migrate"), 0, "")
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	r := gw(t, db, "policy", "show")
	expectCode(t, r, 0, "")
	if r.obj["version"] != 0.0 || r.obj["document"] != nil {
		t.Fatalf("policy show before any apply: %s", r.stdout)
	}
	bad := write("bad.json", `{"principals": [{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"], "sql_role": ["w"]}]}`)
	r = gw(t, db, "policy", "apply", bad)
	if r.code != 2 || errorField(r) != "principals[0].sql_role" {
		t.Fatalf("policy apply of a misspelt field: exit %d %s; want exit 2 naming principals[0].sql_role", r.code, r.stdout)
	}
	r = gw(t, db, "policy", "apply", filepath.Join(dir, "missing.json"))
	if r.code != 2 || errorField(r) != "file" {
		t.Fatalf("policy apply of a missing file: exit %d %s; want exit 2 naming file", r.code, r.stdout)
	}
	good := write("good.json", `{"principals": [{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"], "sql_roles": ["report_worker"]}]}`)
	r = gw(t, db, "policy", "apply", good)
	expectCode(t, r, 0, "")
	if r.obj["version"] != 1.0 || r.obj["principals"] != 1.0 {
		t.Fatalf("policy apply: %s; want version 1, 1 principal", r.stdout)
	}
	r = gw(t, db, "policy", "show")
	expectCode(t, r, 0, "")
	doc, _ := r.obj["document"].(map[string]any)
	ps, _ := doc["principals"].([]any)
	if r.obj["version"] != 1.0 || r.obj["applied_by"] == "" || len(ps) != 1 {
		t.Fatalf("policy show: %s; want version 1 and the document", r.stdout)
	}
	if p := ps[0].(map[string]any); p["name"] != "reports" || p["key_scope"] != "resource" {
		t.Fatalf("policy show's principal: %v", p)
	}
}

// gateway policy apply works in every query mode, the PgBouncer ones (exec,
// simple_protocol) included: the rule set's JSON columns are sent as text.
// They were sent as bytes, which those modes encode as bytea, and jsonb
// refused them: exit 1, "invalid input syntax for type json".
func TestPolicyApplyInEveryQueryMode(t *testing.T) {
	t.Parallel()
	doc := filepath.Join(t.TempDir(), "rules.json")
	if err := os.WriteFile(doc, []byte(`{"principals": [{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"]}],
		"destinations": {"email": {"senders": ["reports@example.com"]}, "webhook": {"hosts": ["hooks.example.com"]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"cache_statement", "cache_describe", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := testdb.NewURL(t)
			expectCode(t, gw(t, db, "migrate"), 0, "")
			r := gw(t, db, "policy", "apply", "--database-query-mode", mode, doc)
			expectCode(t, r, 0, "")
			r = gw(t, db, "policy", "show", "--database-query-mode", mode)
			expectCode(t, r, 0, "")
			d, _ := r.obj["document"].(map[string]any)
			if dests, _ := d["destinations"].(map[string]any); r.obj["version"] != 1.0 || len(dests) != 2 {
				t.Fatalf("policy show: %s; want version 1 with two destinations", r.stdout)
			}
		})
	}
}

// ceoMail is a mail from a sender the test's rule set does not allow.
const ceoMail = `{"to":"alice@example.com","from":"ceo@example.com","subject":"s","text":"t"}`

// One rule set for every way in: a principal confined to reports/* and
// email, and mail senders confined to reports@example.com, through Go (outbox, lease), the CLI (--principal), the HTTP intake
// (a token naming the principal, with no scope of its own) and SQL (a role
// mapped to it), can lease and enqueue mail under reports/, and nothing
// else: another resource, another kind, an epoch advance, and naming no
// principal are each refused as forbidden, a mail from another sender as
// invalid input, each naming the field, with nothing stored.
func TestPrincipalConfinedOnEveryWayIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newRunEnv(t)
	s := testdb.Schema()
	role := testdb.Role(t, e.pool, "fg_reports_", testdb.WorkerGrants()...)
	doc := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(doc, []byte(fmt.Sprintf(`{"principals": [
		{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"], "sql_roles": [%q]}],
		"destinations": {"email": {"senders": ["reports@example.com"]}}}`, role)), 0o600); err != nil {
		t.Fatal(err)
	}
	expectCode(t, gw(t, e.db, "policy", "apply", doc), 0, "")

	checks := 0
	forbidden := func(way string, err error, field string) {
		t.Helper()
		checks++
		var f *fenceerr.ForbiddenError
		if !errors.As(err, &f) || f.Field != field {
			t.Errorf("%s: %v; want forbidden naming %s", way, err, field)
		}
	}
	invalid := func(way string, err error, field string) {
		t.Helper()
		checks++
		var ie *fenceerr.InvalidError
		if !errors.As(err, &ie) || ie.Field != field {
			t.Errorf("%s: %v; want invalid input naming %s", way, err, field)
		}
	}
	allowed := func(way string, err error) {
		t.Helper()
		checks++
		if err != nil {
			t.Errorf("%s: %v; want it allowed", way, err)
		}
	}

	// Go.
	iss := lease.NewIssuer(e.pool, lease.WithSchema(s), lease.AsPrincipal("reports"))
	ob, err := outbox.New(e.pool, outbox.Config{Schema: s, Principal: "reports"})
	if err != nil {
		t.Fatal(err)
	}
	l, err := iss.Acquire(ctx, "reports/go", "w", time.Minute)
	allowed("Go: acquire reports/go", err)
	_, err = ob.Enqueue(ctx, outbox.Intent{Resource: "reports/go", Epoch: l.Epoch, OperationID: "m", Kind: "email", Payload: json.RawMessage(cliEmail)})
	allowed("Go: enqueue mail on reports/go", err)
	_, err = iss.Acquire(ctx, "billing/go", "w", time.Minute)
	forbidden("Go: acquire billing/go", err, "resource")
	_, err = ob.Enqueue(ctx, outbox.Intent{Resource: "reports/go", Epoch: l.Epoch, OperationID: "f", Kind: "file", Payload: json.RawMessage(`{"target":"a.txt","content":"x"}`)})
	forbidden("Go: enqueue a file", err, "kind")
	_, err = iss.Advance(ctx, "reports/go", l.Epoch+10)
	forbidden("Go: advance reports/go", err, "epochs")
	_, err = ob.Enqueue(ctx, outbox.Intent{Resource: "reports/go", Epoch: l.Epoch, OperationID: "ceo", Kind: "email", Payload: json.RawMessage(ceoMail)})
	invalid("Go: a mail from a sender outside the destinations", err, "payload.from")
	_, err = lease.NewIssuer(e.pool, lease.WithSchema(s)).Acquire(ctx, "reports/go", "w", time.Minute)
	forbidden("Go: acquire naming no principal", err, "principal")

	// The CLI.
	cliForbidden := func(way string, r cliResult, field string) {
		t.Helper()
		checks++
		eb, _ := r.obj["error"].(map[string]any)
		if r.code != 2 || eb["code"] != "forbidden" || errorField(r) != field {
			t.Errorf("CLI: %s: exit %d %s; want exit 2, forbidden naming %s", way, r.code, r.stdout, field)
		}
	}
	r := gw(t, e.db, "lease", "acquire", "--principal", "reports", "--resource", "reports/cli", "--holder", "w", "--ttl", "60s")
	expectCode(t, r, 0, "")
	checks++
	epoch := jsonNum(r.obj["epoch"])
	expectCode(t, gw(t, e.db, "enqueue", "--principal", "reports", "--resource", "reports/cli", "--epoch", epoch, "--op", "m", "--kind", "email", "--payload", cliEmail), 0, "")
	checks++
	cliForbidden("acquire billing/cli", gw(t, e.db, "lease", "acquire", "--principal", "reports", "--resource", "billing/cli", "--holder", "w"), "resource")
	cliForbidden("enqueue a file", gw(t, e.db, "enqueue", "--principal", "reports", "--resource", "reports/cli", "--epoch", epoch, "--op", "f",
		"--kind", "file", "--payload", `{"target":"a.txt","content":"x"}`), "kind")
	cliForbidden("epoch advance", gw(t, e.db, "epoch", "advance", "--principal", "reports", "--resource", "reports/cli", "--epoch", "99"), "epochs")
	cliForbidden("acquire naming no principal", gw(t, e.db, "lease", "acquire", "--resource", "reports/cli", "--holder", "w"), "principal")
	r = gw(t, e.db, "enqueue", "--principal", "reports", "--resource", "reports/cli", "--epoch", epoch, "--op", "ceo", "--kind", "email", "--payload", ceoMail)
	checks++
	if r.code != 2 || errorField(r) != "payload.from" {
		t.Errorf("CLI: a mail from a sender outside the destinations: exit %d %s; want exit 2 naming payload.from", r.code, r.stdout)
	}

	// HTTP: the token has no scope of its own; its principal's rules hold.
	addr := freeAddr(t)
	const secret = "rw-secret-0123456789abcdef"
	p := e.run(t, []string{"GATEWAY_TOKENS=rw:worker:" + secret + ":principal=reports"}, "--adapters", "", "--admin-addr", addr)
	defer p.stop(t)
	waitAdmin(t, addr)
	api := "http://" + addr + "/api/v1"
	httpForbidden := func(way string, code int, body map[string]any, field string) {
		t.Helper()
		checks++
		eb, _ := body["error"].(map[string]any)
		if code != http.StatusForbidden || eb["code"] != "forbidden" || eb["field"] != field {
			t.Errorf("HTTP: %s: %d %v; want 403 forbidden naming %s", way, code, body, field)
		}
	}
	code, body := postJSON(t, api+"/leases", secret, `{"resource":"reports/http","holder":"w","ttl_ms":60000}`)
	checks++
	if code != http.StatusCreated {
		t.Fatalf("HTTP: lease reports/http: %d %v", code, body)
	}
	he := int64(body["epoch"].(float64))
	code, body = postJSON(t, api+"/intents", secret, fmt.Sprintf(`{"resource":"reports/http","epoch":%d,"operation_id":"m","kind":"email","payload":%s}`, he, cliEmail))
	checks++
	if code != http.StatusCreated && code != http.StatusOK {
		t.Errorf("HTTP: enqueue mail on reports/http: %d %v", code, body)
	}
	code, body = postJSON(t, api+"/leases", secret, `{"resource":"billing/http","holder":"w","ttl_ms":60000}`)
	httpForbidden("lease billing/http", code, body, "resource")
	code, body = postJSON(t, api+"/intents", secret, fmt.Sprintf(`{"resource":"reports/http","epoch":%d,"operation_id":"f","kind":"file","payload":{"target":"a.txt","content":"x"}}`, he))
	httpForbidden("enqueue a file", code, body, "kind")
	code, body = postJSON(t, api+"/intents", secret, fmt.Sprintf(`{"resource":"reports/http","epoch":%d,"operation_id":"ceo","kind":"email","payload":%s}`, he, ceoMail))
	checks++
	if eb, _ := body["error"].(map[string]any); code != http.StatusBadRequest || eb["field"] != "payload.from" {
		t.Errorf("HTTP: a mail from a sender outside the destinations: %d %v; want 400 naming payload.from", code, body)
	}

	// SQL: the mapped role.
	conn := testdb.ConnectAs(t, e.pool, role)
	var se int64
	err = conn.QueryRow(ctx, testdb.SQL(`SELECT epoch FROM fencegate.acquire('reports/sql', 'w', interval '1 minute')`)).Scan(&se)
	allowed("SQL: acquire reports/sql", err)
	_, err = conn.Exec(ctx, testdb.SQL(`SELECT * FROM fencegate.enqueue('reports/sql', $1, 'm', 'email', $2::jsonb)`), se, cliEmail)
	allowed("SQL: enqueue mail on reports/sql", err)
	sqlForbidden := func(way string, err error, field string) {
		t.Helper()
		checks++
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "ZF007" || pe.ColumnName != field {
			t.Errorf("SQL: %s: %v; want ZF007 naming %s", way, err, field)
		}
	}
	_, err = conn.Exec(ctx, testdb.SQL(`SELECT * FROM fencegate.acquire('billing/sql', 'w', interval '1 minute')`))
	sqlForbidden("acquire billing/sql", err, "resource")
	_, err = conn.Exec(ctx, testdb.SQL(`SELECT * FROM fencegate.enqueue('reports/sql', $1, 'f', 'file', '{"target":"a.txt","content":"x"}'::jsonb)`), se)
	sqlForbidden("enqueue a file", err, "kind")
	_, err = conn.Exec(ctx, testdb.SQL(`SELECT * FROM fencegate.enqueue('reports/sql', $1, 'ceo', 'email', $2::jsonb)`), se, ceoMail)
	checks++
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "ZF004" || pe.ColumnName != "payload.from" {
		t.Errorf("SQL: a mail from a sender outside the destinations: %v; want ZF004 naming payload.from", err)
	}

	// Nothing but the four mails, on reports/, by the principal.
	var n, other int
	if err := e.pool.QueryRow(ctx, testdb.SQL(`SELECT count(*), count(*) FILTER (WHERE kind <> 'email' OR resource_id NOT LIKE 'reports/%' OR principal IS DISTINCT FROM 'reports')
		FROM fencegate.intents`)).Scan(&n, &other); err != nil {
		t.Fatal(err)
	}
	checks++
	if n != 4 || other != 0 {
		t.Errorf("%d intents stored, %d of them not a mail on reports/ by reports; want 4 and 0", n, other)
	}
	var foreign int
	if err := e.pool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.resources WHERE resource_id LIKE 'billing/%'`)).Scan(&foreign); err != nil || foreign != 0 {
		t.Errorf("%d control rows of billing/ made by refused grants (%v)", foreign, err)
	}
	if checks < 20 {
		t.Fatalf("only %d checks ran", checks)
	}
	t.Logf("%d checks over Go, the CLI, HTTP and SQL", checks)
}

// gateway policy init --from-flags prints the rule set of today's flags and
// tokens (no secret), which gateway policy apply takes as it is.
func TestPolicyInitFromFlags(t *testing.T) {
	t.Parallel()
	const secret = "wk-secret-0123456789abcdef"
	env := []string{
		"GATEWAY_TOKENS=reports:worker:" + secret + ":resources=reports/*:kinds=email,ops:operator:op-secret-0123456789abcdef",
		"GATEWAY_KEY_SCOPE=resource",
		"GATEWAY_MAIL_FROM_ALLOW=reports@example.com,example.org",
		"GATEWAY_WEBHOOK_ALLOW=hooks.example.com,billing.internal:8443",
		"GATEWAY_FILE_ALLOW=reports/*.txt,archive/**",
		"GATEWAY_S3_BUCKET=reports",
	}
	r := gwEnv(t, env, "", "policy", "init", "--from-flags")
	expectCode(t, r, 0, "")
	if strings.Contains(r.stdout, secret) {
		t.Fatalf("policy init printed a token's secret: %s", r.stdout)
	}
	var d policy.Document
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Principals) != 2 || d.Principals[0].Name != "reports" || d.Principals[0].KeyScope != "resource" ||
		strings.Join(d.Principals[0].Resources, ",") != "reports/*" || strings.Join(d.Principals[1].Resources, ",") != "*" {
		t.Fatalf("principals: %+v", d.Principals)
	}
	dst := d.Destinations
	if dst.Email == nil || len(dst.Email.Senders) != 2 || dst.Webhook == nil || len(dst.Webhook.Hosts) != 2 ||
		dst.File == nil || len(dst.File.Targets) != 2 || dst.S3 == nil || dst.S3.Buckets[0] != "reports" {
		t.Fatalf("destinations: %s", r.stdout)
	}
	path := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(path, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	db, _ := migratedDB(t)
	expectCode(t, gw(t, db, "policy", "apply", path), 0, "")
	r = gwEnv(t, nil, "", "policy", "init")
	if r.code != 2 || errorField(r) != "from_flags" {
		t.Fatalf("policy init without --from-flags: exit %d %s", r.code, r.stdout)
	}
	// No tokens, no principal: a document apply would refuse (it would
	// refuse every worker, SQL role and token) is not printed.
	r = gwEnv(t, []string{"GATEWAY_WEBHOOK_ALLOW=hooks.example.com"}, "", "policy", "init", "--from-flags")
	if r.code != 2 || errorField(r) != "tokens" {
		t.Fatalf("policy init --from-flags without tokens: exit %d %s; want exit 2 naming tokens", r.code, r.stdout)
	}
	// With the environment gateway run uses: $GATEWAY_TOKENS_FILE, which
	// wins over $GATEWAY_TOKENS as in run (it was ignored: exit 2, "no
	// admin API tokens"), and the help names it.
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("billing:worker:"+secret+":resources=billing/*\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, env := range [][]string{{"GATEWAY_TOKENS_FILE=" + tokens}, {"GATEWAY_TOKENS_FILE=" + tokens, "GATEWAY_TOKENS=ops:operator:op-secret-0123456789abcdef"}} {
		r = gwEnv(t, env, "", "policy", "init", "--from-flags")
		expectCode(t, r, 0, "")
		var fromFile policy.Document
		if err := json.Unmarshal([]byte(r.stdout), &fromFile); err != nil {
			t.Fatal(err)
		}
		if len(fromFile.Principals) != 1 || fromFile.Principals[0].Name != "billing" || strings.Contains(r.stdout, secret) {
			t.Fatalf("policy init with %v: %s; want the file's one principal", env, r.stdout)
		}
	}
	r = gwEnv(t, []string{"GATEWAY_TOKENS_FILE=" + filepath.Join(t.TempDir(), "missing")}, "", "policy", "init", "--from-flags")
	if r.code != 2 || errorField(r) != "tokens_file" {
		t.Fatalf("policy init with a missing $GATEWAY_TOKENS_FILE: exit %d %s; want exit 2 naming tokens_file", r.code, r.stdout)
	}
	help := gwOut(t, nil, "", "policy", "init", "--help")
	if !strings.Contains(help.stdout, "$GATEWAY_TOKENS_FILE") {
		t.Fatalf("policy init --help does not name $GATEWAY_TOKENS_FILE:\n%s", help.stdout)
	}
	empty := filepath.Join(t.TempDir(), "empty.json")
	if err := os.WriteFile(empty, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r = gw(t, db, "policy", "apply", empty)
	if r.code != 2 || errorField(r) != "principals" {
		t.Fatalf("policy apply {}: exit %d %s; want exit 2 naming principals", r.code, r.stdout)
	}
}
