// Package clients_test runs fencegate's client packages, Python
// (clients/python) and TypeScript (clients/typescript), installed the way
// a user installs them (scripts/tools.sh, setup_clients: pip install
// ./clients/python into a virtual environment, npm install pg
// ./clients/typescript into a project), against the test run's PostgreSQL,
// as a worker role with docs/sql.md's grants and nothing else. Each
// language's driver (clients/python/tests/driver.py,
// clients/typescript/test/driver.js) is a small program over its client.
//
// Covered per language: the article's scenario (a worker holding a lease
// with its Keeper is stopped with SIGSTOP past its TTL, another worker
// takes over, the first is resumed: its Keeper says at once that the lease
// can no longer be trusted, and its late write is refused with the typed
// stale-epoch error); a lost response retried with the same operation id
// (a duplicate, not a second intent); and the typed errors of ZF002-ZF007
// and of a wrong interface version.
package clients_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/jsonproc"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/policy"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// lang is one client's driver: the command line that runs it.
type lang struct {
	name string
	cmd  func(t *testing.T) []string
}

var nodeDriverOnce sync.Once

var langs = []lang{
	{"python", func(t *testing.T) []string {
		py := os.Getenv("FENCEGATE_PYTHON")
		if py == "" {
			t.Fatal("FENCEGATE_PYTHON is not set: run the test command (scripts/test.sh), whose setup_clients (scripts/tools.sh) pip-installs ./clients/python into a virtual environment")
		}
		driver, err := filepath.Abs(filepath.Join("python", "tests", "driver.py"))
		if err != nil {
			t.Fatal(err)
		}
		return []string{py, driver}
	}},
	{"typescript", func(t *testing.T) []string {
		project := os.Getenv("FENCEGATE_NODE_PROJECT")
		if project == "" {
			t.Fatal("FENCEGATE_NODE_PROJECT is not set: run the test command (scripts/test.sh), whose setup_clients (scripts/tools.sh) npm-installs pg and ./clients/typescript into a project")
		}
		// The driver runs inside the project, where require finds the
		// package as the project installed it.
		dst := filepath.Join(project, "driver.js")
		var err error
		nodeDriverOnce.Do(func() {
			var b []byte
			if b, err = os.ReadFile(filepath.Join("typescript", "test", "driver.js")); err == nil {
				err = os.WriteFile(dst, b, 0o644)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		return []string{"node", dst}
	}},
}

// database makes the test's database with the drivers' own table
// (client_notes), and a role with docs/sql.md's grants and the right to
// write that table; it returns a pool (as the database's owner) and the
// role's URL.
func database(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	dbURL := testdb.NewURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE client_notes (id bigint PRIMARY KEY, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	role := testdb.Role(t, pool, "fg_client_", append(testdb.WorkerGrants(),
		"GRANT SELECT, INSERT ON client_notes TO {role}")...)
	return pool, roleURL(t, dbURL, role)
}

// eachLang runs test for each client's driver (cmd, the command line that
// runs l's), in parallel, each on a database of its own: pool as its owner,
// dbURL the worker role's (database).
func eachLang(t *testing.T, test func(t *testing.T, l lang, cmd []string, pool *pgxpool.Pool, dbURL string)) {
	for _, l := range langs {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			cmd := l.cmd(t)
			pool, dbURL := database(t)
			test(t, l, cmd, pool, dbURL)
		})
	}
}

func roleURL(t *testing.T, dbURL, role string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, testdb.RolePassword)
	return u.String()
}

func env(dbURL string) []string {
	return append(os.Environ(), "GATEWAY_DATABASE_URL="+dbURL, "GATEWAY_SCHEMA="+testdb.Schema())
}

// run runs the driver with args and decodes the JSON object it prints.
func run(t *testing.T, cmd []string, dbURL string, args ...string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, cmd[0], append(cmd[1:], args...)...)
	c.Env = env(dbURL)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("%s %v: %v\nstdout: %s\nstderr: %s", filepath.Base(cmd[1]), args, err, stdout.String(), stderr.String())
	}
	var out map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v printed %q, not one JSON object: %v (stderr %s)", args, stdout.String(), err, stderr.String())
	}
	return out
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func note(id int) string {
	return fmt.Sprintf(`{"to":"alice@example.com","from":"notes@example.com","subject":"note %d","text":"written"}`, id)
}

// expectError checks that got is the typed error class with want's fields.
func expectError(t *testing.T, what string, got map[string]any, class string, want map[string]any) {
	t.Helper()
	if got["error"] != class || got["is_fencegate_error"] != (class != "InterfaceVersionError") {
		t.Errorf("%s = %v; want a %s", what, got, class)
		return
	}
	for k, v := range want {
		if fmt.Sprint(got[k]) != fmt.Sprint(v) {
			t.Errorf("%s: %s is %v, want %v (the error: %v)", what, k, got[k], v, got)
		}
	}
}

// timeOf is v, a driver's RFC 3339 timestamp.
func timeOf(t *testing.T, v any) time.Time {
	t.Helper()
	s, _ := v.(string)
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("timestamp %v: %v", v, err)
	}
	return at
}

// The SQL interface through each client, as a worker role: the lease, the
// business row and its intent in one transaction with the epoch passed, a
// retry after a lost response, and each refusal as its typed error.
func TestClientCalls(t *testing.T) {
	eachLang(t, func(t *testing.T, l lang, cmd []string, pool *pgxpool.Pool, dbURL string) {
		const resource = "notes"

		if v := run(t, cmd, dbURL, "version"); v["interface_version"] != float64(1) || v["schema"] != testdb.Schema() {
			t.Fatalf("version = %v; want interface 1 in schema %s", v, testdb.Schema())
		}
		got := run(t, cmd, dbURL, "acquire", resource, "worker-a", "60000")
		epoch := num(got["epoch"])
		if epoch < 1 {
			t.Fatalf("acquire = %v", got)
		}
		// Another holder meanwhile: ZF005, saying until when worker-a
		// holds the lease as the same kind of value the lease carries (a
		// datetime, a Date), the same instant.
		held := run(t, cmd, dbURL, "acquire", resource, "worker-b", "60000")
		expectError(t, "acquire by worker-b", held, "LeaseHeldError",
			map[string]any{"sqlstate": "ZF005", "holder": "worker-a", "current_epoch": epoch, "resource": resource})
		if a, h := timeOf(t, got["expires_at"]), timeOf(t, held["expires_at"]); !a.Truncate(time.Millisecond).Equal(h.Truncate(time.Millisecond)) {
			t.Errorf("LeaseHeldError's expires_at %v; want the lease's %v", held["expires_at"], got["expires_at"])
		}

		sent := run(t, cmd, dbURL, "send", resource, itoa(epoch), "1", "note-1", note(1))
		if sent["outcome"] != "created" || sent["status"] != "pending" || num(sent["current_epoch"]) != epoch {
			t.Fatalf("send = %v; want created, pending, at epoch %d", sent, epoch)
		}
		// The response was lost: the worker retries with the same
		// operation id, and gets the same intent, not a second one.
		again := run(t, cmd, dbURL, "send", resource, itoa(epoch), "1", "note-1", note(1))
		if again["outcome"] != "duplicate" || again["intent_id"] != sent["intent_id"] {
			t.Fatalf("retry = %v; want a duplicate of intent %v", again, sent["intent_id"])
		}
		if n := testdb.Int(t, pool, `SELECT count(*) FROM fencegate.intents WHERE operation_id = 'note-1' AND epoch = $1`, epoch); n != 1 {
			t.Fatalf("%d intents of note-1 after the retry, want 1", n)
		}
		if n := testdb.Int(t, pool, `SELECT count(*) FROM client_notes WHERE id = 1`); n != 1 {
			t.Fatalf("%d rows of note 1, want 1", n)
		}

		// The same operation id with other content: ZF003.
		expectError(t, "send with other content", run(t, cmd, dbURL, "send", resource, itoa(epoch), "2", "note-1", note(2)), "ConflictError",
			map[string]any{"sqlstate": "ZF003", "operation_id": "note-1", "intent_id": sent["intent_id"], "resource": resource})
		// Bad input: ZF004 naming the field; the row of the transaction is gone too.
		expectError(t, "send to a bad address", run(t, cmd, dbURL, "send", resource, itoa(epoch), "3", "note-3",
			`{"to":"not an address","from":"notes@example.com","subject":"s","text":"t"}`), "InvalidInputError",
			map[string]any{"sqlstate": "ZF004", "field": "payload.to[0]"})
		if n := testdb.Int(t, pool, `SELECT count(*) FROM client_notes WHERE id IN (2, 3)`); n != 0 {
			t.Fatalf("refused enqueues left %d rows of their transactions", n)
		}

		// Renew keeps the epoch; release frees the lease; the next
		// grant is a new epoch, and the old one is fenced out.
		if r := run(t, cmd, dbURL, "renew", resource, "worker-a", itoa(epoch), "60000"); r["expires_at"] == nil {
			t.Fatalf("renew = %v", r)
		}
		if r := run(t, cmd, dbURL, "release", resource, "worker-a", itoa(epoch)); r["released"] != true {
			t.Fatalf("release = %v", r)
		}
		next := num(run(t, cmd, dbURL, "acquire", resource, "worker-b", "60000")["epoch"])
		if next <= epoch {
			t.Fatalf("acquire after release: epoch %d, want above %d", next, epoch)
		}
		expectError(t, "send with the old epoch", run(t, cmd, dbURL, "send", resource, itoa(epoch), "4", "note-4", note(4)), "StaleEpochError",
			map[string]any{"sqlstate": "ZF002", "supplied_epoch": epoch, "current_epoch": next, "resource": resource, "cause_is_" + causeKey(l.name): true})
		expectError(t, "renew of the old epoch", run(t, cmd, dbURL, "renew", resource, "worker-a", itoa(epoch), "60000"), "StaleEpochError",
			map[string]any{"sqlstate": "ZF002", "supplied_epoch": epoch, "current_epoch": next})
		if n := testdb.Int(t, pool, `SELECT count(*) FROM client_notes WHERE id = 4`) +
			testdb.Int(t, pool, `SELECT count(*) FROM fencegate.intents WHERE operation_id = 'note-4'`); n != 0 {
			t.Fatalf("a fenced-out worker's transaction left %d rows", n)
		}
		// The retry of the first send still finds its intent.
		if late := run(t, cmd, dbURL, "send", resource, itoa(epoch), "1", "note-1", note(1)); late["outcome"] != "duplicate" || late["intent_id"] != sent["intent_id"] {
			t.Fatalf("retry after the takeover = %v; want a duplicate of intent %v", late, sent["intent_id"])
		}
	})
}

func causeKey(lang string) string {
	if lang == "python" {
		return "psycopg"
	}
	return "pg"
}

// ZF006 and ZF007 under a rule set, and InterfaceVersionError for a schema
// without fencegate and for another interface version.
func TestClientRefusals(t *testing.T) {
	eachLang(t, func(t *testing.T, _ lang, cmd []string, pool *pgxpool.Pool, dbURL string) {
		ctx := context.Background()
		reports := testdb.Role(t, pool, "fg_reports_", testdb.WorkerGrants()...)
		doc, err := policy.Parse([]byte(fmt.Sprintf(`{"principals": [
			{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"], "sql_roles": [%q]}]}`, reports)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := policy.Apply(ctx, pool, testdb.Schema(), doc); err != nil {
			t.Fatal(err)
		}
		reportsURL := roleURL(t, dbURL, reports)
		if got := run(t, cmd, reportsURL, "acquire", "reports/daily", "w", "60000"); num(got["epoch"]) < 1 {
			t.Fatalf("acquire reports/daily as the reports principal = %v", got)
		}
		expectError(t, "acquire outside the principal's resources", run(t, cmd, reportsURL, "acquire", "billing", "w", "60000"), "ForbiddenError",
			map[string]any{"sqlstate": "ZF007", "field": "resource", "principal": "reports", "resource": "billing"})
		role := mustURL(t, dbURL).User.Username()
		expectError(t, "acquire by a role mapped to no principal", run(t, cmd, dbURL, "acquire", "reports/daily", "w", "60000"), "NoPrincipalError",
			map[string]any{"sqlstate": "ZF006", "field": "role", "role": role})

		// A schema without fencegate, and another interface version.
		c := exec.Command(cmd[0], append(cmd[1:], "version")...)
		c.Env = append(env(dbURL), "GATEWAY_SCHEMA=nosuch")
		b, err := c.Output()
		if err != nil {
			t.Fatalf("version in schema nosuch: %v %s", err, b)
		}
		var missing map[string]any
		if err := json.Unmarshal(b, &missing); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		expectError(t, "version in schema nosuch", missing, "InterfaceVersionError", map[string]any{"schema": "nosuch", "wanted": 1, "found": nil})
		if _, err := pool.Exec(ctx, testdb.SQL(`CREATE OR REPLACE FUNCTION fencegate.interface_version() RETURNS int LANGUAGE sql AS 'SELECT 2'`)); err != nil {
			t.Fatal(err)
		}
		expectError(t, "version 2", run(t, cmd, dbURL, "version"), "InterfaceVersionError", map[string]any{"wanted": 1, "found": 2})
	})
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// The article's scenario, per Keeper: a worker holds a lease with its
// Keeper (TTL 2 s: renewed every 667 ms, trusted until 1.8 s after the last
// renewal began) and is stopped with SIGSTOP; PostgreSQL lets the lease
// expire and another worker takes it (a new epoch); the first is resumed
// with SIGCONT. Its Keeper must say at once, before any renewal answered,
// that the lease can no longer be trusted (still_valid false, the
// cancellation signal set, reason "expired"), and its late write with the
// old epoch is refused with the typed stale-epoch error, storing nothing.
//
// While the worker is stopped its wall clock is stepped back by the length
// of the pause (libfaketime, in that process only: as an NTP step or a VM
// resumed with its old clock would), so only a Keeper that measures time
// on the monotonic clock sees the pause. Measured on the wall clock, the
// lease would still look fresh on waking (still_valid true, and the loss
// learnt only from a refused renewal, reason "stale_epoch"): the test
// fails. The driver reports its wall clock, and the test checks the step
// took effect, so this is never vacuous.
func TestKeeperAfterPause(t *testing.T) {
	for _, v := range keeperVariants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			pausedWorker(t, langs[v.lang].cmd(t), v.extra)
		})
	}
}

func pausedWorker(t *testing.T, cmd []string, extra []string) {
	ctx := context.Background()
	lib := os.Getenv("FAKETIME_LIB")
	if lib == "" {
		t.Fatal("FAKETIME_LIB is not set: run the test command (scripts/test.sh), whose setup_clients installs Debian's libfaketime")
	}
	pool, dbURL := database(t)
	const resource = "notes"
	clockFile := filepath.Join(t.TempDir(), "faketime")
	if err := os.WriteFile(clockFile, []byte("+0\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	c := exec.Command(cmd[0], append(append(cmd[1:], "hold", resource, "worker-a", "2000"), extra...)...)
	c.Env = append(env(dbURL), "LD_PRELOAD="+lib, "FAKETIME_TIMESTAMP_FILE="+clockFile,
		"FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1")
	worker := jsonproc.Start(t, "the worker", c)

	held := worker.Next("held", 30*time.Second)
	epoch := num(held["epoch"])
	if held["event"] != "held" || epoch < 1 {
		t.Fatalf("the worker printed %v, want held", held)
	}
	expiry := func() (time.Time, bool) {
		var at time.Time
		var live bool
		if err := pool.QueryRow(ctx, testdb.SQL(`SELECT lease_expires_at, lease_expires_at > now() FROM fencegate.resources WHERE resource_id = $1`),
			resource).Scan(&at, &live); err != nil {
			t.Fatal(err)
		}
		return at, live
	}
	// The Keeper renews: the lease's expiry moves on.
	first, _ := expiry()
	poll(t, "a renewal by the keeper", 5*time.Second, func() bool { at, _ := expiry(); return at.After(first) })

	worker.Signal(syscall.SIGSTOP)
	stoppedAt := time.Now()
	// PostgreSQL lets the lease expire; worker B takes it over.
	poll(t, "the stopped worker's lease to expire", 10*time.Second, func() bool { _, live := expiry(); return !live })
	taken := run(t, cmd, dbURL, "acquire", resource, "worker-b", "60000")
	takeover := num(taken["epoch"])
	if takeover <= epoch {
		t.Fatalf("worker-b's acquire = %v; want an epoch above %d", taken, epoch)
	}
	// The stopped worker's wall clock goes back by the pause (and a
	// second): on the wall clock, no time passed while it was stopped.
	paused := time.Since(stoppedAt)
	if err := os.WriteFile(clockFile, []byte(fmt.Sprintf("-%.3f\n", paused.Seconds()+1)), 0o644); err != nil {
		t.Fatal(err)
	}
	worker.Signal(syscall.SIGCONT)
	worker.Send("check")
	got := worker.Next("the check after the pause", 30*time.Second)
	wallAdvance := got["wall"].(float64) - held["wall"].(float64)
	t.Logf("stopped %.2fs (TTL 2s); the worker's wall clock advanced %.2fs from held to check; its keeper renewed %v times; after: %v",
		paused.Seconds(), wallAdvance, got["renewals"], got)
	if wallAdvance > paused.Seconds()/2 {
		t.Fatalf("the worker's wall clock advanced %.2fs across a pause of %.2fs: the step back (libfaketime) did not take effect, so this test could not tell a wall-clock keeper", wallAdvance, paused.Seconds())
	}
	if got["still_valid"] != false {
		t.Errorf("after a pause past its TTL the keeper still trusts the lease (still_valid true): it measured the pause on a clock that did not see it")
	}
	if got["cancelled"] != true || got["reason"] != "expired" {
		t.Errorf("the keeper's cancellation: fired %v, reason %v; want fired, reason expired (its own deadline, not a refused renewal)", got["cancelled"], got["reason"])
	}
	w, _ := got["write"].(map[string]any)
	expectError(t, "the late write with the old epoch", w, "StaleEpochError",
		map[string]any{"sqlstate": "ZF002", "supplied_epoch": epoch, "current_epoch": takeover, "resource": resource})
	if n := testdb.Int(t, pool, `SELECT count(*) FROM client_notes`) +
		testdb.Int(t, pool, `SELECT count(*) FROM fencegate.intents WHERE operation_id LIKE 'late-%'`); n != 0 {
		t.Errorf("the fenced-out worker's late write left %d rows", n)
	}
	// It ends when its input does, leaving worker-b's lease alone.
	worker.CloseInput()
	if err := worker.Wait(30 * time.Second); err != nil {
		t.Errorf("after its input closed: %v; stderr: %s", err, worker.Stderr())
	}
	var holder string
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT holder FROM fencegate.resources WHERE resource_id = $1 AND epoch = $2`), resource, takeover).Scan(&holder); err != nil || holder != "worker-b" {
		t.Errorf("after the stale worker exited the resource is held by %q (%v); want worker-b at epoch %d", holder, err, takeover)
	}
}

// poll waits until cond holds, failing after within.
func poll(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Each client's own unit tests, in its ecosystem's runner: unittest
// against the installed Python package, node --test against dist/.
func TestClientUnitTests(t *testing.T) {
	t.Run("python", func(t *testing.T) {
		cmd := langs[0].cmd(t)
		out, err := exec.Command(cmd[0], "-m", "unittest", "discover", "-s", filepath.Join("python", "tests"), "-p", "test_*.py").CombinedOutput()
		t.Logf("%s", out)
		if err != nil {
			t.Fatalf("python -m unittest: %v", err)
		}
		if !bytes.Contains(out, []byte("\nOK")) || bytes.Contains(out, []byte("Ran 0 tests")) {
			t.Fatal("unittest ran no test, or did not say OK")
		}
	})
	t.Run("typescript", func(t *testing.T) {
		out, err := exec.Command("node", "--test", filepath.Join("typescript", "test", "unit.test.js")).CombinedOutput()
		t.Logf("%s", out)
		if err != nil {
			t.Fatalf("node --test: %v", err)
		}
		if bytes.Contains(out, []byte("# pass 0\n")) || !bytes.Contains(out, []byte("# fail 0\n")) {
			t.Fatal("node --test passed no test, or failed some")
		}
	})
}

// dist/ is committed (npm install ./clients/typescript links the directory
// and runs no build), so it must be what tsc makes of src/ now.
func TestTypeScriptDistIsTheBuild(t *testing.T) {
	tsc := filepath.Join("typescript", "node_modules", ".bin", "tsc")
	if _, err := os.Stat(tsc); err != nil {
		t.Fatalf("%v: run the test command (scripts/test.sh), whose setup_clients runs npm ci in clients/typescript", err)
	}
	out := t.TempDir()
	if b, err := exec.Command(tsc, "-p", filepath.Join("typescript", "tsconfig.json"), "--outDir", out).CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, b)
	}
	built, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadDir(filepath.Join("typescript", "dist"))
	if err != nil {
		t.Fatal(err)
	}
	if len(built) == 0 || len(built) != len(committed) {
		t.Fatalf("tsc made %d files, dist/ holds %d: run npm run build in clients/typescript and commit dist/", len(built), len(committed))
	}
	same := 0
	for _, f := range built {
		want, _ := os.ReadFile(filepath.Join(out, f.Name()))
		got, err := os.ReadFile(filepath.Join("typescript", "dist", f.Name()))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("dist/%s is not tsc's build of src/ (%v): run npm run build in clients/typescript and commit dist/", f.Name(), err)
			continue
		}
		same++
	}
	t.Logf("%d of %d files of dist/ equal tsc's build", same, len(built))
}
