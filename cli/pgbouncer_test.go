package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/pgbouncer"
	"github.com/fencegate/fencegate/internal/testkit/smtptest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// bouncerQueryMode is the query mode the PgBouncer test gives every
// process and pool: exec, the one that needs no server-side prepared
// statement. With cache_statement (pgx's default) the test fails on
// "prepared statement … already exists / does not exist".
const bouncerQueryMode = "exec"

// bouncerEnv is a test's database reached through a PgBouncer in
// transaction mode.
type bouncerEnv struct {
	direct, through string
	directPool      *pgxpool.Pool
	env             []string // the gateway's query mode and direct URL
}

func (b *bouncerEnv) gw(t *testing.T, args ...string) cliResult {
	t.Helper()
	return gwEnv(t, b.env, b.through, args...)
}

// waitSettled runs `gateway status ID --wait` through the bouncer (its
// waiter LISTENs on the direct URL) until the intent is final, and fails
// unless it is want; it returns the status object.
func (b *bouncerEnv) waitSettled(t *testing.T, id any, want string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := b.gw(t, "status", jsonNum(id), "--wait", "10s")
		expectCode(t, r, 0, "")
		switch r.obj["status"] {
		case "pending", "relayed":
			if time.Now().After(deadline) {
				t.Fatalf("intent %s still %v after 60 s: %s", jsonNum(id), r.obj["status"], r.stdout)
			}
			continue
		case want:
			return r.obj
		}
		t.Fatalf("intent %s ended %v, want %s: %s", jsonNum(id), r.obj["status"], want, r.stdout)
	}
}

// The whole path with PgBouncer (Debian's, pool_mode = transaction, 4
// server connections per database) between every client and PostgreSQL:
// `gateway migrate` (on the direct URL), `gateway run` (its pool through
// the bouncer, its LISTEN on the direct URL), a worker through the CLI
// (lease, enqueue, status --wait), the Go client (issuer, Enqueue, Wait,
// both with the direct URL's listener and polling), the HTTP intake
// (lease, intent, a stale epoch refused, ?wait), and the SQL interface
// (the Python worker, its invoice and intent in one transaction). Every
// email is settled once at Mailpit. Then `gateway run` without the direct
// URL: it says it polls, and an intent still settles.
func TestPgBouncerEndToEnd(t *testing.T) {
	t.Parallel()
	start := time.Now()
	ctx := context.Background()
	direct := testdb.NewURL(t)
	bouncer := pgbouncer.Start(t, testdb.Server(t), pgbouncer.Options{})
	b := &bouncerEnv{direct: direct, through: bouncer.URL(direct),
		env: []string{"GATEWAY_DATABASE_QUERY_MODE=" + bouncerQueryMode, "GATEWAY_DATABASE_DIRECT_URL=" + direct}}
	var err error
	if b.directPool, err = pgxpool.New(ctx, direct); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.directPool.Close)

	// gateway migrate needs a session: refused through the pooler alone,
	// done on the direct URL.
	expectInvalid(t, gwEnv(t, b.env[:1], b.through, "migrate"), "database_direct_url")
	expectCode(t, b.gw(t, "migrate"), 0, "")

	ns := natstest.Start(t)
	mp := smtptest.StartMailpit(t)
	root := t.TempDir()
	const domain = "bouncer.fencegate.test"
	const workerToken = "worker-secret-0123456789abcdef"
	const operatorToken = "operator-secret-0123456789abcdef"
	addr := freeAddr(t)
	runArgs := []string{"--mail-lookup", "mailpit", "--mailpit-url", mp.BaseURL,
		"--smtp-addr", mp.SMTPAddr, "--mail-domain", domain, "--file-root", root, "--poll-interval", "200ms"}
	p := startRun(t, append([]string{"GATEWAY_TOKENS=w:worker:" + workerToken + ",o:operator:" + operatorToken}, b.env...), b.through, ns.URL,
		append(runArgs, "--admin-addr", addr)...)
	waitAdmin(t, addr)
	pollUntil(t, 30*time.Second, "the running line", func() (bool, string) {
		s := p.stderr.String()
		return strings.Contains(s, "gateway: running"), s
	})
	if s := p.stderr.String(); !strings.Contains(s, "database_query_mode="+bouncerQueryMode) || !strings.Contains(s, "listen=database-direct-url") {
		t.Fatalf("the running line does not say the query mode and the LISTEN's URL: %s", s)
	}
	if strings.Contains(p.stderr.String(), direct) && strings.Contains(direct, "@") {
		t.Fatal("the direct URL is in the log")
	}

	var mailIDs []string // Message-IDs of every email sent
	mailOf := func(status map[string]any) {
		t.Helper()
		id, _ := resultOf(t, status)["message_id"].(string)
		if id == "" {
			t.Fatalf("an email's result has no message_id: %v", status)
		}
		mailIDs = append(mailIDs, id)
	}
	const mail = `{"to":"alice@example.com","from":"reports@example.com","subject":"s","text":"t"}`

	// A worker through the CLI.
	r := b.gw(t, "lease", "acquire", "--resource", "cli", "--holder", "A", "--ttl", "60s")
	expectCode(t, r, 0, "")
	epoch := jsonNum(r.obj["epoch"])
	r = b.gw(t, "enqueue", "--resource", "cli", "--epoch", epoch, "--op", "mail-1", "--kind", "email", "--payload", mail)
	expectCode(t, r, 0, "")
	mailOf(b.waitSettled(t, r.obj["intent_id"], "succeeded"))
	r = b.gw(t, "enqueue", "--resource", "cli", "--epoch", epoch, "--op", "file-1", "--kind", "file",
		"--payload", `{"target":"cli.txt","content":"through the bouncer"}`)
	expectCode(t, r, 0, "")
	b.waitSettled(t, r.obj["intent_id"], "succeeded")
	if got, err := os.ReadFile(filepath.Join(root, "cli.txt")); err != nil || string(got) != "through the bouncer" {
		t.Fatalf("published file = %q, %v", got, err)
	}
	expectCode(t, b.gw(t, "epoch", "advance", "--resource", "cli", "--epoch", "1000"), 0, "")
	r = b.gw(t, "enqueue", "--resource", "cli", "--epoch", epoch, "--op", "mail-stale", "--kind", "email", "--payload", mail)
	expectCode(t, r, errmap.ExitStale, "stale_epoch")

	// The Go client on a pool through the bouncer.
	cfg, err := pgxpool.ParseConfig(b.through)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	lease.RequirePrimary(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	issuer := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()))
	for _, c := range []struct {
		name string
		ocfg outbox.Config
	}{
		{"listening on the direct URL", outbox.Config{ListenPool: b.directPool}},
		{"polling", outbox.Config{DisableListen: true}},
	} {
		c.ocfg.Schema = testdb.Schema()
		client, err := outbox.New(pool, c.ocfg)
		if err != nil {
			t.Fatal(err)
		}
		l, err := issuer.Acquire(ctx, "go", "go-worker", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		res, err := client.Enqueue(ctx, outbox.Intent{Resource: "go", Epoch: l.Epoch, OperationID: "mail-" + c.name,
			Kind: "email", Payload: json.RawMessage(mail)})
		if err != nil {
			t.Fatalf("%s: enqueue: %v", c.name, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rec, err := client.Wait(wctx, res.IntentID)
		cancel()
		if err != nil || rec.Status != outbox.StatusSucceeded {
			t.Fatalf("%s: wait: %v, %v", c.name, rec, err)
		}
		var m map[string]any
		_ = json.Unmarshal(rec.Result, &m)
		mailOf(map[string]any{"result": m})
	}

	// The HTTP intake.
	api := "http://" + addr + "/api/v1"
	code, body := postJSON(t, api+"/leases", workerToken, `{"resource":"http","holder":"h","ttl_ms":60000}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /leases = %d %v", code, body)
	}
	httpEpoch := jsonNum(body["epoch"])
	code, body = postJSON(t, api+"/intents", workerToken, `{"resource":"http","epoch":`+httpEpoch+`,"operation_id":"mail-http","kind":"email","payload":`+mail+`}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /intents = %d %v", code, body)
	}
	httpID := body["intent_id"]
	// The holder takes the lease again: a new epoch, the old one fenced.
	if code, body = postJSON(t, api+"/leases", workerToken, `{"resource":"http","holder":"h","ttl_ms":60000}`); code != http.StatusCreated || jsonNum(body["epoch"]) == httpEpoch {
		t.Fatalf("POST /leases again = %d %v, want 201 and a new epoch", code, body)
	}
	if code, body = postJSON(t, api+"/intents", workerToken, `{"resource":"http","epoch":`+httpEpoch+`,"operation_id":"mail-http-stale","kind":"email","payload":`+mail+`}`); code != http.StatusConflict {
		t.Fatalf("POST /intents with a stale epoch = %d %v, want 409", code, body)
	}
	// The intake's long poll: woken by the outcome's notification on the
	// direct URL's LISTEN connection.
	req, err := http.NewRequest("GET", api+"/intents/"+jsonNum(httpID)+"?wait=30s", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+operatorToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var waited map[string]any
	err = json.NewDecoder(res.Body).Decode(&waited)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK || waited["status"] != "succeeded" {
		t.Fatalf("GET /intents/%s?wait=30s = %d %v (%v), want 200 succeeded", jsonNum(httpID), res.StatusCode, waited, err)
	}
	mailOf(b.waitSettled(t, httpID, "succeeded"))

	// The SQL interface: the Python worker, its invoice and its intent in
	// one transaction, through the bouncer.
	if _, err := b.directPool.Exec(ctx, `CREATE TABLE invoices (id bigint PRIMARY KEY, email text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// The worker imports the client package: the virtual environment the
	// test command pip-installs ./clients/python into (setup_clients).
	py := os.Getenv("FENCEGATE_PYTHON")
	if py == "" {
		t.Fatal("FENCEGATE_PYTHON is not set: run the test command (scripts/test.sh), whose setup_clients pip-installs ./clients/python into a virtual environment")
	}
	worker := filepath.Join("..", "examples", "sql-worker", "python", "worker.py")
	runPy := func(args ...string) map[string]any {
		t.Helper()
		cmd := exec.Command(py, append([]string{worker}, args...)...)
		cmd.Env = append(os.Environ(), "GATEWAY_DATABASE_URL="+b.through, "GATEWAY_SCHEMA="+testdb.Schema())
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("python worker %v: %v: %s %s", args, err, out.String(), errb.String())
		}
		var m map[string]any
		if err := json.Unmarshal(out.Bytes(), &m); err != nil {
			t.Fatalf("python worker %v printed %q", args, out.String())
		}
		return m
	}
	got := runPy("acquire", "invoices", "py-worker", "60000")
	pyEpoch := jsonNum(got["epoch"])
	got = runPy("send", "invoices", pyEpoch, "1001", "alice@example.com")
	if got["outcome"] != "created" || got["intent_id"] == nil {
		t.Fatalf("python send = %v", got)
	}
	mailOf(b.waitSettled(t, got["intent_id"], "succeeded"))

	p.stop(t)

	// Without the direct URL: nothing LISTENs through the pooler; the relay
	// polls, and an intent still settles.
	p = startRun(t, b.env[:1], b.through, ns.URL, runArgs...)
	pollUntil(t, 30*time.Second, "the running line", func() (bool, string) {
		s := p.stderr.String()
		return strings.Contains(s, "gateway: running"), s
	})
	if s := p.stderr.String(); !strings.Contains(s, `listen="none (polling)"`) {
		t.Fatalf("the running line does not say the relay polls: %s", s)
	}
	r = b.gw(t, "lease", "acquire", "--resource", "poll", "--holder", "A", "--ttl", "60s")
	expectCode(t, r, 0, "")
	r = gwEnv(t, b.env[:1], b.through, "enqueue", "--resource", "poll", "--epoch", jsonNum(r.obj["epoch"]), "--op", "mail-poll", "--kind", "email", "--payload", mail)
	expectCode(t, r, 0, "")
	mailOf(b.waitSettled(t, r.obj["intent_id"], "succeeded"))
	p.stop(t)

	for _, id := range mailIDs {
		if n := countMessageID(t, mp, id); n != 1 {
			t.Fatalf("Mailpit holds %d messages with Message-ID %s, want 1", n, id)
		}
	}
	var settled, other int
	if err := b.directPool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status <> 'succeeded') FROM fencegate.intents`)).Scan(&settled, &other); err != nil {
		t.Fatal(err)
	}
	if settled != len(mailIDs)+1 || other != 0 {
		t.Fatalf("%d intents succeeded and %d did not; want %d emails and 1 file, all succeeded", settled, other, len(mailIDs))
	}
	t.Logf("through PgBouncer (%s mode): %d emails settled once each, 1 file, 2 stale enqueues refused, in %s",
		bouncerQueryMode, len(mailIDs), time.Since(start).Round(time.Millisecond))
}

// A query mode that is not one of --database-query-mode's is bad input
// naming it, before anything connects, from the flag or the environment.
func TestDatabaseQueryModeChecked(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"status", "1", "--database-query-mode", "describe_exec"},
		{"lease", "acquire", "--resource", "r", "--holder", "h", "--ttl", "1s", "--database-query-mode", "prepared"},
		{"migrate", "--database-query-mode", "nope"},
	} {
		expectInvalid(t, gw(t, unreachableDB, args...), "database_query_mode")
	}
	expectInvalid(t, gwEnv(t, []string{"GATEWAY_DATABASE_QUERY_MODE=nope"}, unreachableDB, "ls"), "database_query_mode")
	runBadFlags(t, []string{"GATEWAY_DATABASE_QUERY_MODE=nope"}, []string{"--adapters", "file"}, "database_query_mode")
}
