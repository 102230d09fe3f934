// Package java_test builds the Java client (clients/java, package
// dev.fencegate) with javac and runs it against the test run's PostgreSQL,
// as a role granted only docs/sql.md's interface: its JUnit tests in one
// JVM (the business row and the intent in one transaction, a lost response
// retried with the same operation id, every typed exception, the Keeper on
// a clock the tests drive), and the article's scenario in another: a worker
// JVM holding a lease with its Keeper is stopped (SIGSTOP) past its TTL,
// another worker takes over, the wall clock the paused JVM sees is stepped
// back an hour (libfaketime), and the worker is resumed (SIGCONT): its
// Keeper must say at once that the lease can no longer be trusted, which
// it can only do on the monotonic clock, and its write with the old epoch
// is refused (StaleEpochException) with nothing stored.
//
// The JDK, the JDBC driver, JUnit 4 and libfaketime come from Debian's
// packages (scripts/tools.sh's setup_java_client); a missing one fails the
// test, saying how to get it. It never skips.
package java_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/jsonproc"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/policy"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// tools are the JDK's commands and the jars and library the tests need.
type tools struct {
	javac, java string
	jdbc        string // the PostgreSQL JDBC driver
	junit       string // JUnit 4 and Hamcrest, a class path
	faketime    string // libfaketimeMT.so.1
}

const howToInstall = "run the test command (scripts/test.sh: setup_java_client), or apt-get install openjdk-17-jdk-headless libpostgresql-jdbc-java junit4 libfaketime"

func findTools(t *testing.T) tools {
	t.Helper()
	var tl tools
	var err error
	for _, c := range []struct {
		dst  *string
		name string
	}{{&tl.javac, "javac"}, {&tl.java, "java"}} {
		if home := os.Getenv("JAVA_HOME"); home != "" {
			*c.dst = filepath.Join(home, "bin", c.name)
		} else if *c.dst, err = exec.LookPath(c.name); err != nil {
			t.Fatalf("%s is missing: %s", c.name, howToInstall)
		}
	}
	tl.jdbc = cmpOr(os.Getenv("FENCEGATE_JDBC_JAR"), "/usr/share/java/postgresql.jar")
	tl.junit = cmpOr(os.Getenv("FENCEGATE_JUNIT_CLASSPATH"), "/usr/share/java/junit4.jar:/usr/share/java/hamcrest-core.jar")
	tl.faketime = os.Getenv("FENCEGATE_FAKETIME_LIB")
	if tl.faketime == "" {
		if m, _ := filepath.Glob("/usr/lib/*/faketime/libfaketimeMT.so.1"); len(m) > 0 {
			tl.faketime = m[0]
		}
	}
	for _, p := range append([]string{tl.javac, tl.java, tl.jdbc, tl.faketime}, strings.Split(tl.junit, ":")...) {
		if _, err := os.Stat(p); p == "" || err != nil {
			t.Fatalf("%q is missing (%v): %s", p, err, howToInstall)
		}
	}
	return tl
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

var readmeJavaRE = regexp.MustCompile("(?s)```java\n(.*?)```")

// compile builds the library and its tests in one javac run (a JVM start
// is seconds on a small machine) and returns the classes' directory.
func compile(t *testing.T, tl tools) string {
	t.Helper()
	var sources []string
	for _, dir := range []string{"src/main/java", "src/test/java"} {
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(p, ".java") {
				sources = append(sources, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(sources) < 10 {
		t.Fatalf("only %d Java sources found under src/: %v", len(sources), sources)
	}
	// The README's worker compiles against the library as it is.
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := readmeJavaRE.FindSubmatch(readme)
	if block == nil || !bytes.Contains(block[1], []byte("class InvoiceWorker")) {
		t.Fatal("README.md has no ```java block with class InvoiceWorker")
	}
	worker := filepath.Join(t.TempDir(), "InvoiceWorker.java")
	if err := os.WriteFile(worker, block[1], 0o644); err != nil {
		t.Fatal(err)
	}
	sources = append(sources, worker)
	out := t.TempDir()
	args := append([]string{"--release", "17", "-Xlint:all", "-Werror", "-encoding", "UTF-8",
		"-d", out, "-cp", tl.jdbc + ":" + tl.junit}, sources...)
	if b, err := exec.Command(tl.javac, args...).CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, b)
	}
	t.Logf("javac: %d sources compiled (the README's worker among them)", len(sources))
	return out
}

// jdbcURL is dbURL (postgres://user[:password]@host:port/db) as a JDBC URL
// for user and password.
func jdbcURL(t *testing.T, dbURL, user, password string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := url.Values{"user": {user}}
	if password != "" {
		q.Set("password", password)
	}
	return "jdbc:postgresql://" + u.Host + u.Path + "?" + q.Encode()
}

func newPool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func exec1(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestJavaClient(t *testing.T) {
	tl := findTools(t)
	classes := compile(t, tl)
	schema := testdb.Schema()

	// The worker's database: the application's invoices table, and a role
	// with docs/sql.md's grants and its own table's, nothing else.
	dbURL := testdb.NewURL(t)
	pool := newPool(t, dbURL)
	exec1(t, pool, `CREATE TABLE invoices (id bigint PRIMARY KEY, email text NOT NULL)`)
	worker := testdb.Role(t, pool, "java_worker_", append(testdb.WorkerGrants(), "GRANT SELECT, INSERT ON invoices TO {role}")...)

	// A database with a rule set in force: one role mapped to principal
	// billing (resources invoices*, kind email), one mapped to none.
	policyURL := testdb.NewURL(t)
	policyPool := newPool(t, policyURL)
	mapped := testdb.Role(t, policyPool, "java_billing_", testdb.WorkerGrants()...)
	unmapped := testdb.Role(t, policyPool, "java_nobody_", testdb.WorkerGrants()...)
	doc, err := policy.Parse([]byte(fmt.Sprintf(`{"principals": [{"name": "billing", "role": "worker",
		"resources": ["invoices*"], "kinds": ["email"], "sql_roles": [%q]}]}`, mapped)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Apply(context.Background(), policyPool, schema, doc); err != nil {
		t.Fatal(err)
	}

	u, _ := url.Parse(dbURL)
	adminPassword, _ := u.User.Password()
	env := append(os.Environ(),
		"FENCEGATE_TEST_SCHEMA="+schema,
		"FENCEGATE_TEST_WORKER_URL="+jdbcURL(t, dbURL, worker, testdb.RolePassword),
		"FENCEGATE_TEST_ADMIN_URL="+jdbcURL(t, dbURL, u.User.Username(), adminPassword),
		"FENCEGATE_TEST_MAPPED_URL="+jdbcURL(t, policyURL, mapped, testdb.RolePassword),
		"FENCEGATE_TEST_UNMAPPED_URL="+jdbcURL(t, policyURL, unmapped, testdb.RolePassword),
	)

	t.Run("junit", func(t *testing.T) {
		t.Parallel()
		runJUnit(t, tl, classes, env)
	})
	t.Run("paused worker", func(t *testing.T) {
		t.Parallel()
		pausedWorker(t, tl, classes, env, pool, worker)
	})
}

var summaryRE = regexp.MustCompile(`java client: (\d+) checks ran, (\d+) failed`)

// runJUnit runs the JUnit tests (RunTests) in one JVM.
func runJUnit(t *testing.T, tl tools, classes string, env []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tl.java, "-cp", classes+":"+tl.jdbc+":"+tl.junit, "dev.fencegate.RunTests")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	m := summaryRE.FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("RunTests: %v\n%s", err, out)
	}
	ran, _ := strconv.Atoi(string(m[1]))
	t.Logf("%s", m[0])
	if ran == 0 {
		t.Fatalf("no JUnit test ran:\n%s", out)
	}
}

func num(t *testing.T, m map[string]any, key string) int64 {
	t.Helper()
	f, ok := m[key].(float64)
	if !ok {
		t.Fatalf("%v has no number %s", m, key)
	}
	return int64(f)
}

// pausedWorker is the article's scenario with a real process: see the
// package comment and PausedWorker.java.
func pausedWorker(t *testing.T, tl tools, classes string, env []string, pool *pgxpool.Pool, role string) {
	ctx := context.Background()
	const (
		resource = "invoices-paused"
		// The worker's first write (a JVM's first JDBC statements) must end
		// inside the keeper's trust window (ttl minus the margin): its
		// renewals wait on the resource's row while that transaction is
		// open. 3 s was too little on a loaded machine (a clean run saw
		// still_valid false on the first line); the pause below waits about
		// a ttl for the lease to expire.
		ttl = 6 * time.Second
	)
	// The wall clock the worker's JVM sees: libfaketime reads this file at
	// every clock_gettime(CLOCK_REALTIME) (FAKETIME_NO_CACHE), and leaves
	// the monotonic clock alone (FAKETIME_DONT_FAKE_MONOTONIC).
	offset := filepath.Join(t.TempDir(), "faketime")
	if err := os.WriteFile(offset, []byte("+0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, tl.java, "-cp", classes+":"+tl.jdbc, "dev.fencegate.PausedWorker",
		resource, "worker-a", strconv.FormatInt(ttl.Milliseconds(), 10))
	cmd.Env = append(env, "LD_PRELOAD="+tl.faketime, "FAKETIME_TIMESTAMP_FILE="+offset,
		"FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1")
	// A stopped JVM still dies of the cleanup's SIGKILL.
	worker := jsonproc.Start(t, "the worker", cmd)

	// 1. It holds the lease, and wrote invoice 1001 and its email with the epoch.
	holding := worker.Next("the holding line", time.Minute)
	epochA := num(t, holding, "epoch")
	if holding["state"] != "holding" || holding["outcome"] != "CREATED" || holding["still_valid"] != true {
		t.Fatalf("first line %v; want holding, CREATED, still_valid (first_write_ms: how long from the keeper's hold to the end of the first write, against a trust window of %s less the margin)", holding, ttl)
	}
	t.Logf("the worker's first write ended %v ms after its keeper's hold (ttl %s)", holding["first_write_ms"], ttl)

	// 2. Paused past its TTL; meanwhile the wall clock it sees steps back
	// an hour (as NTP or an operator might), and worker-b takes over once
	// the database says the lease expired.
	worker.Signal(syscall.SIGSTOP)
	paused := time.Now()
	if err := os.WriteFile(offset, []byte("-3600s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := testdb.ConnectAs(t, pool, role)
	var epochB int64
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := b.QueryRow(ctx, testdb.SQL(`SELECT epoch FROM fencegate.acquire($1, 'worker-b', interval '1 minute')`), resource).Scan(&epochB)
		if err == nil {
			break
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "ZF005" || time.Now().After(deadline) {
			t.Fatalf("worker-b's acquire: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // poll until the database says it expired
	}
	t.Logf("worker-b took over at epoch %d, %s after the pause began (ttl %s)", epochB, time.Since(paused).Round(time.Millisecond), ttl)
	// worker-b writes, and its transaction is still open when the paused
	// worker resumes: the resource's control row is locked, so the paused
	// worker's renewal waits and cannot tell its keeper anything yet. What
	// the keeper says at resume is its clock's alone.
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO invoices (id, email) VALUES (2001, 'bob@example.com')`); err != nil {
		t.Fatal(err)
	}
	var outcome string
	if err := tx.QueryRow(ctx, testdb.SQL(`SELECT outcome FROM fencegate.enqueue(resource => $1, epoch => $2, operation_id => 'invoice-2001',
		kind => 'email', payload => '{"to": "bob@example.com", "from": "billing@example.com", "subject": "Invoice 2001", "text": "Ready."}')`),
		resource, epochB).Scan(&outcome); err != nil || outcome != "created" {
		t.Fatalf("worker-b's enqueue: %q, %v", outcome, err)
	}

	// 3. Resumed: its keeper must distrust the lease at once.
	worker.Signal(syscall.SIGCONT)
	worker.Send("resume")
	resumed := worker.Next("the line after the resume", 30*time.Second)
	if num(t, resumed, "wall_ms") >= num(t, holding, "wall_ms") {
		t.Fatalf("the worker's wall clock did not step back (%v, then %v): libfaketime is not in effect, and the test would not tell the clocks apart",
			holding["wall_ms"], resumed["wall_ms"])
	}
	reason, _ := resumed["reason"].(string)
	if resumed["still_valid"] != false || !strings.Contains(reason, "LeaseLostException") || !strings.Contains(reason, "no successful renewal within") {
		t.Fatalf("after a pause past the TTL the keeper says %v; want still_valid false, lost for want of a renewal "+
			"(a keeper on the wall clock, stepped back meanwhile, still trusts the lease)", resumed)
	}

	// 4. Its write with the old epoch, made anyway, is refused once
	// worker-b commits; nothing of it is stored.
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wrote := worker.Next("the stale write's line", 30*time.Second)
	done, _ := wrote["done"].(string)
	if wrote["exception"] != "StaleEpochException" || wrote["sqlstate"] != "ZF002" ||
		num(t, wrote, "supplied_epoch") != epochA || num(t, wrote, "current_epoch") != epochB ||
		!strings.HasPrefix(done, "LeaseLostException: ") {
		t.Fatalf("the stale write gave %v; want StaleEpochException ZF002, supplied %d, current %d, and the keeper done with LeaseLostException", wrote, epochA, epochB)
	}
	if err := worker.Wait(30 * time.Second); err != nil {
		t.Fatalf("the worker: %v\nstderr: %s", err, worker.Stderr())
	}
	checks := []struct {
		query string
		arg   any
		want  int
	}{
		{`SELECT count(*) FROM invoices WHERE id = $1`, 1001, 1},
		{`SELECT count(*) FROM fencegate.intents WHERE operation_id = 'invoice-1001' AND epoch = $1`, epochA, 1},
		{`SELECT count(*) FROM invoices WHERE id = $1`, 1002, 0},
		{`SELECT count(*) FROM fencegate.intents WHERE resource_id = $1 AND operation_id = 'invoice-1002'`, resource, 0},
		{`SELECT count(*) FROM fencegate.intents WHERE operation_id = 'invoice-2001' AND epoch = $1`, epochB, 1},
	}
	for _, c := range checks {
		if n := testdb.Int(t, pool, c.query, c.arg); n != c.want {
			t.Errorf("%s (%v): %d, want %d", c.query, c.arg, n, c.want)
		}
	}
	t.Logf("paused worker: lease lost at resume (%s), stale write refused; %d database checks", reason, len(checks))
}
