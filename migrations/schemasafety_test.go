package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fencegate/fencegate/migrations"
)

// The SQL interface's functions run with the rights of the role that ran
// migrate (SECURITY DEFINER): migrate refuses to install them in a schema
// where another role could create a function or operator that name
// resolution inside them might pick, unless told to (AllowUnsafeSchema).
// Each case is refused naming the roles, and nothing is stored; the
// override installs; a schema of fencegate's own (created by migrate) and
// one the migrating role owns with no grant to others are accepted.
func TestUpRefusesSchemaOthersCanCreateIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	suffix := fmt.Sprint(time.Now().UnixNano())
	hostile, app := "fg_hostile_"+suffix, "fg_app_"+suffix
	cases := []struct {
		name, schema string
		setup        []string
		want         []string // the roles named; nil: accepted
	}{
		{"a role granted CREATE on public", "public",
			[]string{"GRANT CREATE ON SCHEMA public TO " + hostile}, []string{hostile}},
		{"PUBLIC granted CREATE on public", "public",
			[]string{"GRANT CREATE ON SCHEMA public TO PUBLIC"}, []string{"PUBLIC"}},
		{"an application's schema, owned by another role", "appdata",
			[]string{"CREATE SCHEMA appdata AUTHORIZATION " + app}, []string{app}},
		{"a schema of its own where a role was granted CREATE", "ours",
			[]string{"CREATE SCHEMA ours", "GRANT CREATE ON SCHEMA ours TO " + hostile}, []string{hostile}},
		{"a schema of its own, USAGE granted only", "ours",
			[]string{"CREATE SCHEMA ours", "GRANT USAGE ON SCHEMA ours TO " + hostile}, nil},
		{"public, CREATE revoked from PUBLIC", "public",
			[]string{"REVOKE CREATE ON SCHEMA public FROM PUBLIC"}, nil},
	}
	admin := emptyDatabase(t)
	for _, stmt := range []string{"CREATE ROLE " + hostile, "CREATE ROLE " + app} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, r := range []string{hostile, app} {
			_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
		}
	})
	checked := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool := emptyDatabase(t)
			for _, stmt := range c.setup {
				if _, err := pool.Exec(ctx, stmt); err != nil {
					t.Fatal(err)
				}
			}
			// Roles are the cluster's: each database drops what it granted
			// before the roles go.
			t.Cleanup(func() {
				for _, r := range []string{hostile, app} {
					_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+r)
				}
			})
			_, err := migrations.Up(ctx, pool, migrations.Config{Schema: c.schema})
			if c.want == nil {
				if err != nil {
					t.Fatalf("Up into %s: %v; want it accepted", c.schema, err)
				}
				checked++
				return
			}
			var unsafe *migrations.UnsafeSchemaError
			if !errors.As(err, &unsafe) {
				t.Fatalf("Up into %s = %v; want an *UnsafeSchemaError", c.schema, err)
			}
			if unsafe.Schema != c.schema || !slices.Equal(unsafe.Roles, c.want) {
				t.Fatalf("refusal = %+v; want schema %s, roles %v", unsafe, c.schema, c.want)
			}
			var tables int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace`, c.schema).Scan(&tables); err != nil {
				t.Fatal(err)
			}
			if tables != 0 {
				t.Fatalf("a refused Up left %d relations in %s", tables, c.schema)
			}
			// Told explicitly, it installs.
			if _, err := migrations.Up(ctx, pool, migrations.Config{Schema: c.schema, AllowUnsafeSchema: true}); err != nil {
				t.Fatalf("Up into %s with AllowUnsafeSchema: %v", c.schema, err)
			}
			if ok, err := migrations.Installed(ctx, pool, c.schema); err != nil || !ok {
				t.Fatalf("Installed(%s) after the override = %t, %v", c.schema, ok, err)
			}
			checked++
		})
	}
	if checked != len(cases) {
		t.Fatalf("%d of %d schema cases checked", checked, len(cases))
	}
	t.Logf("%d of %d schema cases checked", checked, len(cases))
}
