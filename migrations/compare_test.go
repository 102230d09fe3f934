package migrations_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/migrations"
)

// A schema compared with this build: nothing pending or unknown when
// current; a migration this build has and the schema lacks is pending; one
// the schema has and this build lacks (a newer build migrated it) is
// unknown. Up leaves such a schema as it is (a NewerSchemaError):
// its function files would replace the newer build's definitions with
// older ones (it re-applied them, and answered as if current).
func TestNewerSchemaRefusedByUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	v, err := migrations.Compare(ctx, pool, testdb.Schema())
	if err != nil || len(v.Pending) != 0 || len(v.Unknown) != 0 {
		t.Fatalf("a current schema: %+v, %v; want nothing pending or unknown", v, err)
	}
	latest := migrations.Latest()
	// A pending one: the newest of this build, its record taken back.
	restore := testdb.SchemaBehind(t, pool)
	if v, err := migrations.Compare(ctx, pool, testdb.Schema()); err != nil || !slices.Equal(v.Pending, []int64{latest}) {
		t.Fatalf("the newest taken back: %+v, %v; want %d pending", v, err, latest)
	}
	restore()
	testdb.SchemaAhead(t, pool)
	newerOnes := []int64{testdb.NewerMigration}
	if v, err := migrations.Compare(ctx, pool, testdb.Schema()); err != nil || !slices.Equal(v.Unknown, newerOnes) {
		t.Fatalf("a newer build's migration: %+v, %v; want %v unknown", v, err, newerOnes)
	}
	fn := `SELECT p.xmin::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = '` + testdb.Schema() + `' AND p.proname = 'fencegate_timeline_id'`
	var before, after string
	if err := pool.QueryRow(ctx, fn).Scan(&before); err != nil {
		t.Fatal(err)
	}
	_, err = testdb.Migrate(ctx, pool)
	var newer *migrations.NewerSchemaError
	if !errors.As(err, &newer) || !slices.Equal(newer.Unknown, newerOnes) || newer.Latest != latest {
		t.Fatalf("Up on a schema a newer build migrated = %v; want a NewerSchemaError naming %v and %d", err, newerOnes, latest)
	}
	if err := pool.QueryRow(ctx, fn).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Fatalf("the refused Up replaced the functions (fencegate_timeline_id's row %s, now %s)", before, after)
	}
	t.Logf("refused: %v", err)
}
