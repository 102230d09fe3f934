package migrations_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/migrations"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Two migrators racing on an empty database: both succeed, the schema is
// applied exactly once, and a third run finds nothing to do.
func TestUpConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.NewEmptyURL(t)
	const n = 4
	var wg sync.WaitGroup
	counts := make([]int, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				errs[i] = err
				return
			}
			defer pool.Close()
			applied, err := testdb.Migrate(ctx, pool)
			counts[i], errs[i] = len(applied), err
		}()
	}
	wg.Wait()
	total := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		total += counts[i]
	}
	entries, _ := migrations.FS().ReadDir(".")
	files := 0
	for _, e := range entries {
		if !e.IsDir() && len(e.Name()) > 4 && e.Name()[len(e.Name())-4:] == ".sql" {
			files++
		}
	}
	if total != files {
		t.Fatalf("migrations applied %d times in all across %d racing migrators, want each of %d files once", total, n, files)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	again, err := testdb.Migrate(ctx, pool)
	if err != nil || len(again) != 0 {
		t.Fatalf("second run: applied %v, err %v; want nothing", again, err)
	}
}

// Production stays production: the migrated fencegate_enqueue carries no
// failpoint (migration 00015 removed the one 00010 added; the fault test
// installs its own version in its own database).
func TestNoFailpointInProduction(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var def string
	if err := pool.QueryRow(context.Background(),
		testdb.SQL(`SELECT pg_get_functiondef('fencegate.fencegate_enqueue'::regproc)`)).Scan(&def); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(def, "fencegate.failpoint") || strings.Contains(def, "pg_advisory_lock") {
		t.Fatalf("fencegate_enqueue has a failpoint:\n%s", def)
	}
}

// No schema name pgschema accepts is one of the server's keywords that
// cannot name a schema unquoted (reserved, or only a type or function
// name): migrate would fail with a syntax error after the name was
// accepted (exit 1, where a bad --schema is exit 2 naming schema).
func TestSchemaNamesAreNotReservedWords(t *testing.T) {
	t.Parallel()
	words := testdb.Strings(t, testdb.New(t), `SELECT word FROM pg_get_keywords() WHERE catcode IN ('R', 'T')`)
	for _, w := range words {
		if err := pgschema.Check(w); err == nil {
			t.Errorf("schema name %q accepted: the server's keyword cannot name a schema unquoted", w)
		}
	}
	t.Logf("%d of the server's reserved words refused as schema names", len(words))
	if len(words) < 50 {
		t.Fatalf("the server listed %d reserved words", len(words))
	}
}
