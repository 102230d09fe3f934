// Package testdb gives each test its own freshly migrated PostgreSQL
// database, so tests run with t.Parallel() without seeing each other.
//
// The server is the one named by GATEWAY_TEST_DATABASE_URL when that is set
// (the test command sets it to a cluster it started), otherwise a throwaway
// cluster this test binary starts on first use and stops in Main. A test
// never skips for want of PostgreSQL: it fails, saying why.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fencegate/fencegate/internal/pgcluster"
	"github.com/fencegate/fencegate/migrations"
)

// EnvURL names the environment variable with an existing server's URL.
const EnvURL = "GATEWAY_TEST_DATABASE_URL"

var (
	once     sync.Once
	onceErr  error
	baseURL  string
	template string
	cluster  *pgcluster.Cluster
	// createMu serialises CREATE DATABASE … TEMPLATE within this process;
	// PostgreSQL refuses to copy a template another session is copying from
	// only when someone is connected to it, but serialising keeps it cheap.
	createMu sync.Mutex
)

// Main runs the tests of a package and stops the throwaway cluster, if one
// was started. Use it from TestMain: `func TestMain(m *testing.M) { testdb.Main(m) }`.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run runs the tests of a package, stops the throwaway cluster if one was
// started, and returns the exit code instead of exiting, so TestMain can
// check more (leaked goroutines, say) before it calls os.Exit.
func Run(m *testing.M) int {
	code := m.Run()
	if cluster != nil {
		_ = cluster.Stop()
	}
	return code
}

// RunLeakChecked is Run, then the stops (servers the package's TestMain
// started), then, when the tests passed, a check for leaked goroutines (as
// goleak.VerifyTestMain would, but after the throwaway cluster and the
// servers are stopped); it returns the exit code for os.Exit.
func RunLeakChecked(m *testing.M, stops ...func()) int {
	code := Run(m)
	for _, stop := range stops {
		stop()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	return code
}

func setup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	baseURL = os.Getenv(EnvURL)
	if baseURL == "" {
		c, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return fmt.Errorf("start a throwaway PostgreSQL (set %s to use a running one): %w", EnvURL, err)
		}
		cluster = c
		baseURL = c.URL("postgres")
	}
	conn, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return fmt.Errorf("connect to test PostgreSQL at %s: %w", redact(baseURL), err)
	}
	defer conn.Close(ctx)
	template = "fencegate_tmpl_" + randHex(6)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+template); err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	pool, err := pgxpool.New(ctx, WithDB(baseURL, template))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		return fmt.Errorf("migrate template database: %w", err)
	}
	return nil
}

// Server returns the URL of the test server's maintenance database, starting
// a cluster when needed.
func Server(t testing.TB) string {
	t.Helper()
	once.Do(func() { onceErr = setup() })
	if onceErr != nil {
		t.Fatalf("testdb: %v", onceErr)
	}
	return baseURL
}

// NewURL creates a new migrated database for the test, dropped at its end,
// and returns its URL.
func NewURL(t testing.TB) string {
	t.Helper()
	base := Server(t)
	name := "fencegate_test_" + randHex(8)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("testdb: connect: %v", err)
	}
	defer conn.Close(ctx)
	createMu.Lock()
	_, err = conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, template))
	createMu.Unlock()
	if err != nil {
		t.Fatalf("testdb: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return WithDB(base, name)
}

// New creates a new migrated database for the test and returns a pool on it,
// closed at the test's end.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := NewURL(t)
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// WithDB returns rawURL with its database name replaced by db.
func WithDB(rawURL, db string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	u.Path = "/" + db
	return u.String()
}

func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
