// Package migrations holds fencegate's SQL schema and applies it: the
// tables, indexes, types and signature changes as versioned goose
// migrations (NNNNN_name.sql, applied once each, in order), and the stored
// functions as source files (functions/*.sql), each function's one current
// definition, applied in full by every Up after the versioned migrations.
//
// Up is safe to run from several processes at once: it holds a PostgreSQL
// session advisory lock of the schema for the whole run, versioned
// migrations and function files both, so a second `gateway migrate` waits
// for the first and then finds nothing to do. Each migration file runs in
// its own transaction; the function files all run in one.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/pgschema"
)

//go:embed *.sql functions/*.sql
var files embed.FS

// functionsDir is the folder of files holding the functions' definitions.
const functionsDir = "functions"

// FS returns the embedded migration files: the versioned migrations at
// its root, the function files under functions/.
func FS() embed.FS { return files }

// Applied describes one migration applied by Up.
type Applied struct {
	Version int64  `json:"version"`
	Source  string `json:"source"`
}

// Config configures Up.
type Config struct {
	// Schema is the schema fencegate's tables and functions live in,
	// created when missing. Default: "fencegate" (pgschema.Default).
	Schema string
	// AllowUnsafeSchema installs into a schema where roles other than the
	// migrating one (and those that can act as it) may create objects,
	// which Up otherwise refuses with an *UnsafeSchemaError: fencegate's
	// functions run with the migrating role's rights (SECURITY DEFINER),
	// and such a role could otherwise place objects beside them. Set it
	// only when every role that can create there is trusted as much as
	// the migrating role (gateway migrate --allow-unsafe-schema).
	AllowUnsafeSchema bool
	// Logger. Nil: discard.
	Logger *slog.Logger

	// functions replaces the function files (a test's edited copy). Nil:
	// the embedded ones.
	functions fs.FS
}

// versionTable is goose's version table, in the schema.
const versionTable = "fencegate_schema_version"

// Up applies every pending versioned migration to cfg.Schema of the
// database behind pool (creating the schema when missing), then every
// function file, and returns the versioned migrations it applied (none
// when the schema is current). The function files run every time: they
// are how a changed function reaches an installed database, and running
// them again on a current one changes nothing.
//
// The migrations run on connections whose search_path is the schema
// alone, so everything they create lands in it, whatever pool's own
// search_path; every function of fencegate's names its own objects with
// the schema and has its search_path pinned to the catalog alone (the
// SET clause in its file, and PinFunctions in the same transaction), so
// that a function called from a session whose search_path leads elsewhere
// (a worker's transaction in the application's public schema, which may
// well have a table called intents) still reads fencegate's tables, and
// no object of another schema is ever found by name inside it.
//
// A database whose fencegate tables are in another schema (an install
// from before schemas, in public) is refused with an *ElsewhereError
// rather than given a second, empty install: a second set of tables would
// start every resource's epoch from 0 again and hand out fencing tokens
// that were handed out before. Move it first (Move), or name its schema.
func Up(ctx context.Context, pool *pgxpool.Pool, cfg Config) ([]Applied, error) {
	s, err := pgschema.Parse(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := prepareSchema(ctx, pool, s, cfg.AllowUnsafeSchema); err != nil {
		return nil, err
	}
	functions := cfg.functions
	if functions == nil {
		functions, _ = fs.Sub(files, functionsDir)
	}
	return migrate(ctx, pool, s, 0, functions, logger)
}

// migrate runs the versioned migrations up to version (0: all) and then,
// unless functions is nil, the function files, all under the schema's
// migration lock.
//
// The lock is a session advisory lock taken on a connection of its own
// and held until both steps are done: goose's own locker would release it
// when its Up returns, and a second migrator could then apply versioned
// migrations of a newer build between this one's migrations and its
// function files, or replace functions concurrently with this one
// (CREATE OR REPLACE of one function in two transactions at once fails:
// "tuple concurrently updated"). The key is the one goose took before
// (lockKey), so a migrator of an older build, running goose's locker with
// it, waits for this one and the reverse. It is polled with
// pg_try_advisory_lock (goose's locker), never waited for in a statement:
// a session waiting inside a statement has a snapshot open, and a CREATE
// INDEX CONCURRENTLY of the migrator holding the lock waits for every
// such snapshot to end, so a blocking wait would deadlock with it.
func migrate(ctx context.Context, pool *pgxpool.Pool, s pgschema.Schema, version int64, functions fs.FS, logger *slog.Logger) ([]Applied, error) {
	mpool, err := schemaPool(ctx, pool, s)
	if err != nil {
		return nil, err
	}
	defer mpool.Close()
	db := stdlib.OpenDBFromPool(mpool)
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	defer conn.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockKey(s)))
	if err != nil {
		return nil, fmt.Errorf("migrations: create locker: %w", err)
	}
	if err := locker.SessionLock(ctx, conn); err != nil {
		return nil, fmt.Errorf("migrations: lock schema %s: %w", s.Name(), err)
	}
	defer func() { _ = locker.SessionUnlock(context.WithoutCancel(ctx), conn) }()
	// Under the lock, so that no newer migrator lands between the check
	// and what this one applies: a schema a newer build migrated is left
	// as it is. This build's function files would replace the newer
	// build's definitions with older ones, which the newer build's
	// processes (and its own later migrations) rely on.
	if here, err := installed(ctx, mpool, s); err != nil {
		return nil, err
	} else if here {
		v, err := compare(ctx, mpool, s)
		if err != nil {
			return nil, err
		}
		if len(v.Unknown) > 0 {
			return nil, &NewerSchemaError{Schema: s.Name(), Unknown: v.Unknown, Latest: Latest()}
		}
	}
	applied, err := up(ctx, db, s, version, logger)
	if err != nil {
		return nil, err
	}
	if functions == nil {
		return applied, nil
	}
	// On the locked connection, so the lock and the functions' transaction
	// are one session: nothing runs between them that the lock would not
	// order.
	if err := conn.Raw(func(dc any) error {
		return applyFunctions(ctx, dc.(*stdlib.Conn).Conn(), s, functions, logger)
	}); err != nil {
		return applied, err
	}
	return applied, nil
}

// applyFunctions runs every function file of fsys, in name order, in one
// transaction on conn, then pins the search_path of every function of
// fencegate's in the schema: a function is replaced and pinned at once, or
// not at all, and none is ever seen half-updated or unpinned by a session
// calling it. The files hold CREATE OR REPLACE FUNCTION (which keeps the
// grants made to a function since it was created) and the REVOKEs a new
// function needs, so running them again changes nothing.
//
// The files name fencegate's objects "fencegate.<object>", renamed into
// the schema (pgschema.Schema.SQL) before each runs, and each function's
// search_path is the catalog alone (PinFunctions): a name inside a
// function resolves in pg_catalog or in fencegate's schema, named, and
// never in a schema another role may create in, where a function or
// operator of its own could be picked instead of a built-in one and run
// with the rights of the functions' owner. The transaction's own
// search_path is the catalog alone too, so a file's statements mean the
// same in every migrating session.
func applyFunctions(ctx context.Context, conn *pgx.Conn, s pgschema.Schema, fsys fs.FS, logger *slog.Logger) error {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return fmt.Errorf("migrations: function files: %w", err)
	}
	if len(names) == 0 {
		return fmt.Errorf("migrations: no function files (%s/*.sql) in this build", functionsDir)
	}
	slices.Sort(names)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrations: functions: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('search_path', $1, true)`, pinnedSearchPath); err != nil {
		return fmt.Errorf("migrations: functions: %w", err)
	}
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return fmt.Errorf("migrations: function file %s: %w", name, err)
		}
		// No arguments: pgx sends the file as one simple query, every
		// statement of it in this transaction.
		if _, err := tx.Exec(ctx, s.SQL(string(b))); err != nil {
			return fmt.Errorf("migrations: function file %s: %w", path.Join(functionsDir, name), err)
		}
	}
	if err := PinFunctions(ctx, tx, s.Name()); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrations: functions: %w", err)
	}
	logger.Info("migrations: functions applied", "schema", s.Name(), "files", len(names))
	return nil
}

// NewerSchemaError is Up's answer on a schema a newer build migrated
// (migrations this build does not have): nothing was changed. Its function
// files would replace the newer build's definitions with older ones, which
// the newer build's processes rely on. It is no failure of the schema: a
// rollback to this build, or its migrate step run again, meets it, and
// `gateway migrate` and `gateway dev` go on (with a warning).
type NewerSchemaError struct {
	Schema  string
	Unknown []int64 // the newer build's migrations
	Latest  int64   // this build's newest
}

func (e *NewerSchemaError) Error() string {
	return fmt.Sprintf("schema %s was migrated by a newer build (migrations %v, which this build does not have; its newest is %d): "+
		"nothing applied, so that this build's function files do not replace the newer build's", e.Schema, e.Unknown, e.Latest)
}

// UnsafeSchemaError says that roles other than the migrating one can
// create objects in the schema Up was asked to install into.
type UnsafeSchemaError struct {
	// Schema is the schema; Roles the roles that can create in it, by
	// name, "PUBLIC" when every role can.
	Schema string
	Roles  []string
	// Granted are the roles CREATE on the schema was granted to ("PUBLIC"
	// too): what to revoke it from. A role of Roles that is not here
	// creates through one of them (a group it is a member of), or owns
	// the schema (Owner).
	Granted []string
	// Owner is the schema's owner when it is one of Roles: an owner can
	// always create, so only a new owner helps.
	Owner string
}

func (e *UnsafeSchemaError) Error() string {
	var fix []string
	if len(e.Granted) > 0 {
		fix = append(fix, fmt.Sprintf("revoke it from the roles it was granted to (REVOKE CREATE ON SCHEMA %s FROM %s)",
			e.Schema, strings.Join(e.Granted, ", ")))
	}
	if e.Owner != "" {
		fix = append(fix, fmt.Sprintf("give the schema, which %s owns, to the migrating role (ALTER SCHEMA %s OWNER TO …)", e.Owner, e.Schema))
	}
	fix = append(fix, "install into a schema of fencegate's own (--schema)",
		"or, if every one of them is trusted as much as the migrating role, pass --allow-unsafe-schema")
	return fmt.Sprintf("schema: roles other than the migrating role can create objects in schema %q (%s): "+
		"fencegate's SQL functions run with the migrating role's rights, and an object of theirs there could run with them too. "+
		"Either %s", e.Schema, strings.Join(e.Roles, ", "), strings.Join(fix, ", "))
}

// ElsewhereError says that the database's fencegate tables are in another
// schema than the one asked for.
type ElsewhereError struct {
	// Schema is the schema asked for; Found the one holding the tables.
	Schema, Found string
}

func (e *ElsewhereError) Error() string {
	return fmt.Sprintf("schema: fencegate is installed in schema %q of this database, not in %q: "+
		"name that schema (--schema %s, $GATEWAY_SCHEMA), or move the install (gateway migrate --schema %s --move-from %s); "+
		"a second, empty install would hand out fencing epochs again that were handed out before",
		e.Found, e.Schema, e.Found, e.Schema, e.Found)
}

// lockKey is the advisory lock key of migrations into schema s: one per
// schema, so two deployments' migrators in one database don't wait for
// each other, and none that an application's own goose would take.
func lockKey(s pgschema.Schema) int64 { return keyOf("fencegate/migrate/" + s.Name()) }

// schemaLockKey is the advisory lock key of prepareSchema's transaction:
// another key than lockKey's, which goose holds for the whole run in a
// session of its own. A transaction waiting for that key would deadlock
// with a CREATE INDEX CONCURRENTLY of the run, which waits for every open
// transaction to end.
func schemaLockKey(s pgschema.Schema) int64 { return keyOf("fencegate/schema/" + s.Name()) }

func keyOf(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64() >> 1)
}

// prepareSchema creates the schema when missing and refuses a database
// whose fencegate tables are elsewhere, and a schema others can create in
// (unless allowUnsafe; see creators). The transaction-scoped advisory
// lock orders concurrent migrators: without it two CREATE SCHEMA IF NOT
// EXISTS racing on an empty database can both try to create it, and one
// fails on the catalog's unique index.
func prepareSchema(ctx context.Context, pool *pgxpool.Pool, s pgschema.Schema, allowUnsafe bool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, schemaLockKey(s)); err != nil {
		return fmt.Errorf("migrations: lock: %w", err)
	}
	// An install from before schemas has its tables in public. Up never
	// starts a second, empty install beside it (see Up).
	if _, err := installed(ctx, tx, s); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+s.Name()); err != nil {
		return fmt.Errorf("migrations: create schema %s: %w", s.Name(), err)
	}
	// Before anything is installed, and refused with the schema's creation
	// rolled back: a refused Up stores nothing.
	if !allowUnsafe {
		roles, err := creators(ctx, tx, s)
		if err != nil {
			return err
		}
		if len(roles) > 0 {
			granted, owner, err := createGrants(ctx, tx, s, roles)
			if err != nil {
				return err
			}
			return &UnsafeSchemaError{Schema: s.Name(), Roles: roles, Granted: granted, Owner: owner}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrations: create schema %s: %w", s.Name(), err)
	}
	return nil
}

// creators lists the roles, other than the migrating role (current_user),
// that can create objects in schema s: "PUBLIC" alone when CREATE is
// granted to every role, else each role that is not a superuser, cannot act as the
// migrating role (is not a member of it) and owns the schema or holds
// CREATE on it, directly or through a role it belongs to.
//
// Why it matters: fencegate's functions are SECURITY DEFINER, so they run
// with the migrating role's rights, and their search_path holds the schema.
// A role that can create there can add, beside them, a function or an
// operator that name resolution inside them prefers to the built-in one (a
// to_json(text) beats pg_catalog.to_json(anyelement)), and have its code
// run with the migrating role's rights. A superuser could anyway, and so
// could a member of the migrating role; nobody else may be able to. The
// schema public, owned by pg_database_owner, counts as owned by the
// database's owner. Rights granted after migrate are not seen here: keep
// CREATE on fencegate's schema to its owner (docs/sql.md).
func creators(ctx context.Context, tx pgx.Tx, s pgschema.Schema) ([]string, error) {
	rows, err := tx.Query(ctx, `
		WITH n AS (
			SELECT n.oid, n.nspowner, n.nspacl,
			       CASE WHEN n.nspowner = (SELECT oid FROM pg_roles WHERE rolname = 'pg_database_owner')
			            THEN (SELECT datdba FROM pg_database WHERE datname = current_database())
			            ELSE n.nspowner END AS owner
			FROM pg_namespace n WHERE n.nspname = $1
		)
		SELECT 'PUBLIC' FROM n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
		WHERE a.grantee = 0 AND a.privilege_type = 'CREATE'
		UNION
		SELECT r.rolname FROM n, pg_roles r
		WHERE NOT r.rolsuper
		  AND r.rolname <> 'pg_database_owner'
		  AND (r.oid = n.owner OR has_schema_privilege(r.oid, n.oid, 'CREATE'))
		  AND NOT pg_has_role(r.oid, current_user, 'MEMBER')
		ORDER BY 1`, s.Name())
	if err != nil {
		return nil, fmt.Errorf("migrations: who can create in schema %s: %w", s.Name(), err)
	}
	roles, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("migrations: who can create in schema %s: %w", s.Name(), err)
	}
	// Every role can: naming each of them says nothing more.
	if slices.Contains(roles, "PUBLIC") {
		return []string{"PUBLIC"}, nil
	}
	return roles, nil
}

// createGrants says what to undo for the creators roles: the roles CREATE
// on the schema was granted to (its ACL: "PUBLIC" for every role), those
// that are not the migrating role's own, and the schema's owner when it is
// one of roles. The hint named every creator, so a member of a group that
// holds the grant was told to revoke from itself, which changes nothing,
// and an owner to revoke what an owner always has.
func createGrants(ctx context.Context, tx pgx.Tx, s pgschema.Schema, roles []string) (granted []string, owner string, err error) {
	err = tx.QueryRow(ctx, `
		WITH n AS (
			SELECT n.nspowner, n.nspacl,
			       CASE WHEN n.nspowner = (SELECT oid FROM pg_roles WHERE rolname = 'pg_database_owner')
			            THEN (SELECT datdba FROM pg_database WHERE datname = current_database())
			            ELSE n.nspowner END AS owner
			FROM pg_namespace n WHERE n.nspname = $1
		)
		SELECT coalesce((SELECT array_agg(g ORDER BY g) FROM (
		                   SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE r.rolname END AS g
		                   FROM n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
		                   LEFT JOIN pg_roles r ON r.oid = a.grantee
		                   WHERE a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner
		                     AND (a.grantee = 0 OR NOT pg_has_role(a.grantee, current_user, 'MEMBER'))) gs), '{}'),
		       (SELECT rolname FROM pg_roles, n WHERE oid = n.owner)
		FROM n`, s.Name()).Scan(&granted, &owner)
	if err != nil {
		return nil, "", fmt.Errorf("migrations: who was granted CREATE on schema %s: %w", s.Name(), err)
	}
	if !slices.Contains(roles, owner) {
		owner = ""
	}
	return granted, owner, nil
}

// schemaPool is a small pool on pool's database whose connections have
// search_path set to the schema alone (pg_catalog is always searched
// first): the migrations name their objects unqualified, so they create
// them there and read them from there. Three connections: migrate's
// locked one, goose's own and one for goose's migrations.
func schemaPool(ctx context.Context, pool *pgxpool.Pool, s pgschema.Schema) (*pgxpool.Pool, error) {
	cfg := pool.Config().Copy()
	cfg.MaxConns = 3
	cfg.MinConns = 0
	cfg.ConnConfig.RuntimeParams["search_path"] = s.Name() + ", pg_temp"
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// up applies the versioned migrations up to version (0: all). The caller
// holds the schema's migration lock (migrate): without it two `gateway
// migrate` could both see version N and both try to apply N+1.
func up(ctx context.Context, db *sql.DB, s pgschema.Schema, version int64, logger *slog.Logger) ([]Applied, error) {
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithTableName(s.Qualify(versionTable)),
		// A database migrated by a build that lacked a migration numbered
		// below its newest one still gets it: every migration here is
		// written to apply in any order after 00001.
		goose.WithAllowOutofOrder(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	var results []*goose.MigrationResult
	if version == 0 {
		results, err = p.Up(ctx)
	} else {
		results, err = p.UpTo(ctx, version)
	}
	if err != nil {
		return nil, fmt.Errorf("migrations: apply: %w", err)
	}
	applied := make([]Applied, 0, len(results))
	for _, r := range results {
		applied = append(applied, Applied{Version: r.Source.Version, Source: r.Source.Path})
		logger.Info("migrations: applied", "schema", s.Name(), "version", r.Source.Version, "source", r.Source.Path, "duration", r.Duration)
	}
	return applied, nil
}

// pinnedSearchPath is the search_path of every function of fencegate's:
// the catalog, then pg_temp. pg_temp is never searched for functions or
// operators, and listed last it cannot stand in for a table; fencegate's
// own objects are named with their schema.
const pinnedSearchPath = "pg_catalog, pg_temp"

// PinFunctions pins the search_path of every function of fencegate's in
// schema (pgschema.Objects: an application's own functions in the same
// schema, public say, are left alone) to the catalog alone
// (pinnedSearchPath), where it is not pinned so already: no name inside
// them resolves in a schema another role may create in. The functions
// name fencegate's objects with the schema (see applyFunctions); a
// function that does not finds nothing and fails. Up calls it in the
// transaction of the function files; call it again after replacing a
// function by hand (a fault test's failpoint version, its names
// qualified): CREATE OR REPLACE FUNCTION without a SET clause drops the
// setting.
//
// It runs in the caller's session, whatever its search_path (the
// migration's is the schema, and a role that can create there could have
// put a function of its own in the way): every function and operator it
// uses is named with pg_catalog.
func PinFunctions(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, schema string) error {
	s, err := pgschema.Parse(schema)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	// The names are fencegate's constants and the schema a checked
	// identifier: the block is built as text (a DO block takes no
	// parameters).
	names := "{" + strings.Join(pgschema.Objects, ",") + "}"
	if _, err := q.Exec(ctx, `
		DO $$
		DECLARE f pg_catalog.regprocedure;
		BEGIN
			FOR f IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
			         WHERE p.pronamespace OPERATOR(pg_catalog.=) '`+s.Name()+`'::pg_catalog.regnamespace
			           AND p.prokind OPERATOR(pg_catalog.=) 'f'
			           AND p.proname OPERATOR(pg_catalog.=) ANY ('`+names+`'::pg_catalog.name[])
			           AND NOT coalesce('search_path=`+pinnedSearchPath+`' OPERATOR(pg_catalog.=) ANY (p.proconfig), false)
			LOOP
				EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = `+pinnedSearchPath+`', f);
			END LOOP;
		END $$`); err != nil {
		return fmt.Errorf("migrations: pin the functions' search_path: %w", err)
	}
	return nil
}

// Version reports the schema version currently applied in schema ("" is
// the default schema).
func Version(ctx context.Context, pool *pgxpool.Pool, schema string) (int64, error) {
	s, err := pgschema.Parse(schema)
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithTableName(s.Qualify(versionTable)))
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	return p.GetDBVersion(ctx)
}

// Move moves an install of fencegate from schema from (an install from
// before schemas: "public") into schema to, in one transaction: every
// table (with its indexes, constraints, triggers and owned sequences),
// sequence and function of fencegate's (pgschema.Objects) found in from.
// Nothing else in from is touched. It returns the objects moved.
//
// It refuses, with a *fenceerr.InvalidError naming the argument and
// nothing moved or created (not even schema to): a from that holds no
// install (no version table there: a schema that does not exist, a typo,
// which must not end in a fresh, empty install in to that hands out
// epochs again), a to that holds one already, a from that is to, and a
// bad name ("from", "to").
//
// Run Up afterwards (gateway migrate --move-from
// does both): the moved functions' bodies still name the old schema, and
// fail, until Up redefines them from the function files.
//
// Stop every gateway process and worker of the database first: a
// statement already planned against the old schema fails once the tables
// are gone from it. The move takes each table's ACCESS EXCLUSIVE lock, so
// it waits for transactions using them and is quick once it has them
// (catalog updates only, no data is copied).
func Move(ctx context.Context, pool *pgxpool.Pool, from, to string) ([]string, error) {
	if err := pgschema.Check(from); err != nil {
		return nil, fenceerr.Invalid("from", "%v", err)
	}
	dst, err := pgschema.Parse(to)
	if err != nil {
		return nil, fenceerr.Invalid("to", "%v", err)
	}
	if from == dst.Name() {
		return nil, fenceerr.Invalid("from", "%q is the schema moved into itself", from)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// The target's migration lock, and its schema lock: no migrator runs
	// into the target while the move fills it. Tried, not waited for: a
	// transaction waiting for goose's session lock would deadlock with a
	// CREATE INDEX CONCURRENTLY of the run holding it.
	var locked bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1) AND pg_try_advisory_xact_lock($2)`,
		lockKey(dst), schemaLockKey(dst)).Scan(&locked); err != nil {
		return nil, fmt.Errorf("migrations: lock: %w", err)
	}
	if !locked {
		return nil, fmt.Errorf("migrations: move: a migration into schema %s is running; retry when it is done", dst.Name())
	}
	var occupied bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, dst.Qualify(versionTable)).Scan(&occupied); err != nil {
		return nil, fmt.Errorf("migrations: move: %w", err)
	}
	if occupied {
		var empty bool
		if err := tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM `+dst.Qualify("resources")+`)
			AND NOT EXISTS (SELECT 1 FROM `+dst.Qualify("intents")+`)`).Scan(&empty); err != nil {
			return nil, fmt.Errorf("migrations: move: %w", err)
		}
		return nil, fenceerr.Invalid("to", "schema %s holds an install already (empty: %t); nothing was moved; drop it first (DROP SCHEMA %s CASCADE) if it is not in use", dst.Name(), empty, dst.Name())
	}
	// Checked before the schema is created, in the transaction that
	// would create it: a from without an install (a typo) is refused with
	// nothing created, and the caller's Up, which would install afresh,
	// never runs. The version table is what Up and Installed take for an
	// install.
	var source bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{from, versionTable}.Sanitize()).Scan(&source); err != nil {
		return nil, fmt.Errorf("migrations: move: %w", err)
	}
	if !source {
		return nil, fenceerr.Invalid("from", "no fencegate install in schema %s (no %s table there); nothing was moved or created", from, versionTable)
	}
	if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+dst.Name()); err != nil {
		return nil, fmt.Errorf("migrations: create schema %s: %w", dst.Name(), err)
	}
	// relkind r (tables) first: moving a table moves the sequences it owns
	// (its serial columns'), which are then no longer in from.
	rows, err := tx.Query(ctx, `
		SELECT c.relname, c.relkind = 'r' FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'S') AND c.relname = ANY ($2)
		ORDER BY c.relkind DESC, c.relname`, from, pgschema.Objects)
	if err != nil {
		return nil, fmt.Errorf("migrations: move: list tables: %w", err)
	}
	type rel struct {
		name  string
		table bool
	}
	var rels []rel
	for rows.Next() {
		var r rel
		if err := rows.Scan(&r.name, &r.table); err != nil {
			return nil, fmt.Errorf("migrations: move: %w", err)
		}
		rels = append(rels, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrations: move: list tables: %w", err)
	}
	var moved []string
	for _, r := range rels {
		stmt := "ALTER TABLE IF EXISTS "
		if !r.table {
			stmt = "ALTER SEQUENCE IF EXISTS "
		}
		if _, err := tx.Exec(ctx, stmt+pgx.Identifier{from, r.name}.Sanitize()+" SET SCHEMA "+dst.Name()); err != nil {
			return nil, fmt.Errorf("migrations: move %s.%s: %w", from, r.name, err)
		}
		moved = append(moved, r.name)
	}
	// Functions, every overload: triggers and defaults name them by oid,
	// so they keep working where they moved.
	frows, err := tx.Query(ctx, `
		SELECT p.oid::regprocedure::text FROM pg_proc p
		JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname = ANY ($2)
		ORDER BY 1`, from, pgschema.Objects)
	if err != nil {
		return nil, fmt.Errorf("migrations: move: list functions: %w", err)
	}
	fns, err := pgx.CollectRows(frows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("migrations: move: list functions: %w", err)
	}
	for _, f := range fns {
		if _, err := tx.Exec(ctx, "ALTER FUNCTION "+f+" SET SCHEMA "+dst.Name()); err != nil {
			return nil, fmt.Errorf("migrations: move function %s: %w", f, err)
		}
		moved = append(moved, f)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrations: move: %w", err)
	}
	return moved, nil
}

// Installed reports whether fencegate is migrated in schema ("" is the
// default schema). When it is not, and an install from before schemas has
// its tables in public, it returns an *ElsewhereError saying so: a process
// pointed at an empty schema must not look like a new install.
func Installed(ctx context.Context, pool *pgxpool.Pool, schema string) (bool, error) {
	s, err := pgschema.Parse(schema)
	if err != nil {
		return false, err
	}
	return installed(ctx, pool, s)
}

// installed is Installed for a checked schema, on q (a pool, or Up's
// transaction holding the schema's lock).
func installed(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, s pgschema.Schema) (bool, error) {
	var here, legacy bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		s.Qualify(versionTable), "public."+versionTable).Scan(&here, &legacy); err != nil {
		return false, fmt.Errorf("migrations: look for an install: %w", err)
	}
	if !here && legacy && s.Name() != "public" {
		return false, &ElsewhereError{Schema: s.Name(), Found: "public"}
	}
	return here, nil
}
