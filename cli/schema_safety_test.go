package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// gateway migrate into a schema another role can create in is exit 2
// naming schema (the role named, and the way out), and installs nothing;
// --allow-unsafe-schema installs.
func TestMigrateRefusesSchemaOthersCanCreateIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewEmptyURL(t)
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	role := fmt.Sprint("fg_hostile_cli_", time.Now().UnixNano())
	for _, stmt := range []string{"CREATE ROLE " + role, "GRANT CREATE ON SCHEMA public TO " + role} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = conn.Exec(context.Background(), "DROP ROLE "+role)
	})
	r := gw(t, db, "migrate", "--schema", "public")
	if r.code != 2 || errorField(r) != "schema" || !strings.Contains(r.stdout, role) || !strings.Contains(r.stdout, "--allow-unsafe-schema") {
		t.Fatalf("migrate --schema public, %s can create there: exit %d %s; want exit 2 naming schema, the role and --allow-unsafe-schema", role, r.code, r.stdout)
	}
	var installed bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('public.fencegate_schema_version') IS NOT NULL`).Scan(&installed); err != nil || installed {
		t.Fatalf("a refused migrate installed: %t, %v", installed, err)
	}
	r = gw(t, db, "migrate", "--schema", "public", "--allow-unsafe-schema")
	expectCode(t, r, 0, "")
	if r.obj["schema"] != "public" {
		t.Fatalf("migrate --allow-unsafe-schema: %s", r.stdout)
	}
}
