package testdb

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RolePassword is the password of every role Role makes.
const RolePassword = "pw"

// Role makes a role of the test server that can log in (RolePassword),
// named prefix and a unique suffix, and returns its name. With pool, each
// of grants runs in pool's database with every "{role}" replaced by the
// name; at the test's end what the role owns there is dropped (DROP OWNED),
// then the role. Without pool (the role made before its database), only
// the role is dropped: register it first, so that its database goes before
// it.
func Role(t testing.TB, pool *pgxpool.Pool, prefix string, grants ...string) string {
	t.Helper()
	ctx := context.Background()
	name := prefix + randHex(6)
	admin, err := pgx.Connect(ctx, Server(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN NOSUPERUSER PASSWORD '%s'", name, RolePassword)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if pool != nil {
			_, _ = pool.Exec(ctx, "DROP OWNED BY "+name)
		}
		conn, err := pgx.Connect(ctx, Server(t))
		if err != nil {
			t.Errorf("drop role %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+name); err != nil {
			t.Errorf("drop role %s: %v", name, err)
		}
	})
	for _, g := range grants {
		if _, err := pool.Exec(ctx, strings.ReplaceAll(g, "{role}", name)); err != nil {
			t.Fatalf("%s: %v", g, err)
		}
	}
	return name
}

// WorkerGrants are docs/sql.md's grant block for a worker role, in the
// test schema, for Role: USAGE on the schema and EXECUTE on the SQL
// interface (enqueue, acquire, renew, release).
func WorkerGrants() []string {
	s := Schema()
	return []string{
		"GRANT USAGE ON SCHEMA " + s + " TO {role}",
		"GRANT EXECUTE ON FUNCTION " + s + ".enqueue(text, bigint, text, text, jsonb, text, text), " +
			s + ".acquire(text, text, interval, bigint), " + s + ".renew(text, text, bigint, interval), " +
			s + ".release(text, text, bigint) TO {role}",
	}
}

// ConnectAs connects to pool's database as role (made by Role); the
// connection is closed at the test's end, before the role is dropped.
func ConnectAs(t testing.TB, pool *pgxpool.Pool, role string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = role, RolePassword
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}
