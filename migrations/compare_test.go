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
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, testdb.SQL(sql)); err != nil {
			t.Fatal(err)
		}
	}
	// A pending one: the newest of this build, taken back from the
	// record (its changes stay; only the comparison is looked at).
	exec(`UPDATE fencegate.fencegate_schema_version SET is_applied = false WHERE version_id = (SELECT max(version_id) FROM fencegate.fencegate_schema_version)`)
	if v, err := migrations.Compare(ctx, pool, testdb.Schema()); err != nil || !slices.Equal(v.Pending, []int64{latest}) {
		t.Fatalf("the newest taken back: %+v, %v; want %d pending", v, err, latest)
	}
	exec(`UPDATE fencegate.fencegate_schema_version SET is_applied = true`)
	exec(`INSERT INTO fencegate.fencegate_schema_version (version_id, is_applied) VALUES (99999, true)`)
	if v, err := migrations.Compare(ctx, pool, testdb.Schema()); err != nil || !slices.Equal(v.Unknown, []int64{99999}) {
		t.Fatalf("a newer build's migration: %+v, %v; want 99999 unknown", v, err)
	}
	fn := `SELECT p.xmin::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = '` + testdb.Schema() + `' AND p.proname = 'fencegate_timeline_id'`
	var before, after string
	if err := pool.QueryRow(ctx, fn).Scan(&before); err != nil {
		t.Fatal(err)
	}
	_, err = testdb.Migrate(ctx, pool)
	var newer *migrations.NewerSchemaError
	if !errors.As(err, &newer) || !slices.Equal(newer.Unknown, []int64{99999}) || newer.Latest != latest {
		t.Fatalf("Up on a schema a newer build migrated = %v; want a NewerSchemaError naming 99999 and %d", err, latest)
	}
	if err := pool.QueryRow(ctx, fn).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Fatalf("the refused Up replaced the functions (fencegate_timeline_id's row %s, now %s)", before, after)
	}
	t.Logf("refused: %v", err)
}
