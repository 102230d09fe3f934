// Package sqlworker_test runs the SQL interface's example workers, in
// Python and Node.js over fencegate's client packages (clients/python,
// clients/typescript), against a real PostgreSQL migrated by fencegate:
// each worker creates the table it needs (invoices), the invoice and its email intent commit together
// or not at all, a retry after a lost response returns the same intent, a
// worker whose lease was taken over is refused with SQLSTATE ZF002 and
// stores nothing, bad input is ZF004 naming the field, and a live lease of
// another holder is ZF005.
//
// The interpreters come from scripts/tools.sh (setup_clients,
// setup_node_pg): FENCEGATE_PYTHON, a virtual environment where
// ./clients/python is pip-installed, and NODE_BIN with npm ci run in
// node/ (its package.json takes the client from clients/typescript). A
// missing one fails the test, saying how to get it; it never skips.
package sqlworker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { adaptertest.Main(m) }

// worker is one language's example worker.
type worker struct {
	name string
	cmd  func(t *testing.T) []string // the interpreter and the script
}

var workers = []worker{
	{"python", func(t *testing.T) []string {
		py := os.Getenv("FENCEGATE_PYTHON")
		if py == "" {
			t.Fatal("FENCEGATE_PYTHON is not set: run the test command (scripts/test.sh), whose setup_clients pip-installs ./clients/python into a virtual environment")
		}
		if err := exec.Command(py, "-c", "import fencegate").Run(); err != nil {
			t.Fatalf("%s cannot import fencegate (%v): run the test command (scripts/test.sh)", py, err)
		}
		return []string{py, filepath.Join("python", "worker.py")}
	}},
	{"node", func(t *testing.T) []string {
		node := os.Getenv("NODE_BIN")
		if node == "" {
			node = "node"
		}
		for _, m := range []string{"pg", "@fencegate/client"} {
			if _, err := os.Stat(filepath.Join("node", "node_modules", m)); err != nil {
				t.Fatalf("%s is not installed in examples/sql-worker/node (%v): run the test command (scripts/test.sh), or npm ci there", m, err)
			}
		}
		return []string{node, filepath.Join("node", "worker.js")}
	}},
}

// run runs the worker with args and decodes the JSON object it prints.
func run(t *testing.T, w []string, dbURL string, args ...string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, w[0], append(w[1:], args...)...)
	cmd.Env = append(os.Environ(), "GATEWAY_DATABASE_URL="+dbURL, "GATEWAY_SCHEMA="+adaptertest.Schema())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v %v: %v\nstdout: %s\nstderr: %s", w, args, err, stdout.String(), stderr.String())
	}
	var out map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v %v printed %q, not one JSON object: %v (stderr %s)", w, args, stdout.String(), err, stderr.String())
	}
	return out
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), adaptertest.SQL(query), args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestWorkersInOtherLanguages(t *testing.T) {
	for _, w := range workers {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			cmd := w.cmd(t)
			dbURL := adaptertest.NewDatabase(t)
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, dbURL)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			// The workers create the application's own table, invoices, in
			// public beside its own table called intents (every test
			// database has one).
			const resource = "invoices"

			// The lease, through SQL: a new epoch, recorded as Go's are.
			got := run(t, cmd, dbURL, "acquire", resource, "worker-a", "60000")
			epoch := int64(got["epoch"].(float64))
			issuer := lease.NewIssuer(pool, lease.WithSchema(adaptertest.Schema()))
			if r, err := issuer.Get(ctx, resource); err != nil || r.Epoch != epoch || r.Holder != "worker-a" || !r.LeaseLive {
				t.Fatalf("after acquire %v: resource %+v, %v; want epoch %d held by worker-a", got, r, err, epoch)
			}
			// Another holder meanwhile: ZF005, naming the holder.
			held := run(t, cmd, dbURL, "acquire", resource, "worker-b", "60000")
			if d, _ := held["detail"].(map[string]any); held["sqlstate"] != "ZF005" || d["holder"] != "worker-a" || d["current_epoch"] != float64(epoch) {
				t.Fatalf("acquire by worker-b = %v; want ZF005 naming worker-a and epoch %d", held, epoch)
			}

			// The invoice and its email, in one transaction.
			sent := run(t, cmd, dbURL, "send", resource, itoa(epoch), "1001", "alice@example.com")
			if sent["outcome"] != "created" || sent["status"] != "pending" || sent["current_epoch"] != float64(epoch) {
				t.Fatalf("send = %v; want created, pending", sent)
			}
			id := int64(sent["intent_id"].(float64))
			ob, err := outbox.New(pool, outbox.Config{Schema: adaptertest.Schema()})
			if err != nil {
				t.Fatal(err)
			}
			rec, err := ob.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Kind != "email" || rec.Resource != resource || rec.Epoch != epoch || rec.Fence != outbox.FenceCommit ||
				rec.IdempotencyKey != "invoices/invoice-1001" || rec.OperationID != "invoice-1001" {
				t.Fatalf("the intent is %+v; want an email of epoch %d, fence commit, key invoices/invoice-1001", rec, epoch)
			}
			if n := count(t, pool, `SELECT count(*) FROM invoices WHERE id = 1001`); n != 1 {
				t.Fatalf("%d invoice rows, want 1", n)
			}

			// A retry after a lost response (the first answer never
			// reached the worker): the same intent, nothing new.
			again := run(t, cmd, dbURL, "send", resource, itoa(epoch), "1001", "alice@example.com")
			if again["outcome"] != "duplicate" || again["intent_id"] != sent["intent_id"] {
				t.Fatalf("retry = %v; want duplicate of intent %d", again, id)
			}
			if n := count(t, pool, `SELECT count(*) FROM fencegate.intents WHERE operation_id = 'invoice-1001'`); n != 1 {
				t.Fatalf("%d intents after the retry, want 1", n)
			}

			// Rolled back after the enqueue: neither the invoice nor the
			// intent.
			rb := run(t, cmd, dbURL, "send-rollback", resource, itoa(epoch), "1002", "bob@example.com")
			if rb["outcome"] != "created" || rb["rolled_back"] != true {
				t.Fatalf("send-rollback = %v", rb)
			}
			if n := count(t, pool, `SELECT count(*) FROM invoices WHERE id = 1002`) +
				count(t, pool, `SELECT count(*) FROM fencegate.intents WHERE operation_id = 'invoice-1002'`); n != 0 {
				t.Fatalf("after a rollback %d rows remain (invoice and intent), want 0", n)
			}

			// Bad input: ZF004 naming the field, nothing stored.
			bad := run(t, cmd, dbURL, "send", resource, itoa(epoch), "1004", "not an address")
			if bad["sqlstate"] != "ZF004" || bad["field"] != "payload.to[0]" {
				t.Fatalf("send to a bad address = %v; want ZF004 naming payload.to[0]", bad)
			}
			if n := count(t, pool, `SELECT count(*) FROM invoices WHERE id = 1004`); n != 0 {
				t.Fatalf("a refused enqueue left its invoice: %d rows", n)
			}

			// Authority moves on (a lock service's larger epoch): the old
			// epoch is fenced out, and its transaction stores nothing.
			if _, err := issuer.Advance(ctx, resource, epoch+5); err != nil {
				t.Fatal(err)
			}
			stale := run(t, cmd, dbURL, "send", resource, itoa(epoch), "1003", "carol@example.com")
			d, _ := stale["detail"].(map[string]any)
			if stale["sqlstate"] != "ZF002" || d["current_epoch"] != float64(epoch+5) || d["supplied_epoch"] != float64(epoch) || d["code"] != "stale_epoch" {
				t.Fatalf("send with the old epoch = %v; want ZF002 with current_epoch %d, supplied_epoch %d", stale, epoch+5, epoch)
			}
			if n := count(t, pool, `SELECT count(*) FROM invoices WHERE id = 1003`) +
				count(t, pool, `SELECT count(*) FROM fencegate.intents WHERE operation_id = 'invoice-1003'`); n != 0 {
				t.Fatalf("a fenced-out worker's transaction left %d rows, want 0", n)
			}
			// The retry of the first send still finds its intent: a
			// committed intent is not taken back by a takeover.
			late := run(t, cmd, dbURL, "send", resource, itoa(epoch), "1001", "alice@example.com")
			if late["outcome"] != "duplicate" || late["intent_id"] != sent["intent_id"] {
				t.Fatalf("retry after the takeover = %v; want duplicate of intent %d", late, id)
			}
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
