package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/durable"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/otelsetup"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/migrations"
	"github.com/fencegate/fencegate/operator"
)

// Exit codes, part of the public contract (internal/errmap holds them with
// the codes they answer).
const (
	exitOK       = errmap.ExitOK
	exitInternal = errmap.ExitInternal
	exitBadInput = errmap.ExitBadInput
)

// cliError is an error with its code, exit code and JSON error object: the
// contract's one error type, shared with the admin API.
type cliError = errmap.Error

func badInput(field, msg string) *cliError { return errmap.Invalid(field, msg) }

// unavailable is a dependency (PostgreSQL, NATS) that cannot be used.
func unavailable(msg string) *cliError { return errmap.New(errmap.Unavailable, msg) }

// classify maps an error to its exit code and JSON error body; the admin
// API maps through the same errmap.Map.
func classify(err error) *cliError { return errmap.Map(err) }

func oneLine(s string) string { return errmap.OneLine(s) }

// fail writes the error object on stdout and a one-line message on stderr,
// and returns the exit code.
func (a *app) fail(err error) int {
	ce := classify(a.schemaBehind(err))
	a.writeJSON(map[string]any{"error": ce.Body()})
	fmt.Fprintf(a.stderr, "gateway: %s\n", oneLine(ce.Message))
	return ce.Exit()
}

// schemaBehind is err, or, when err is a statement that found no table,
// function or column where fencegate's should be and the schema lacks
// migrations of this build (a new CLI before the upgrade's gateway
// migrate), bad input naming schema that says so, as gateway run says at
// start. Anything else, or when the versions cannot be read, is err.
func (a *app) schemaBehind(err error) error {
	var pgErr *pgconn.PgError
	if a.dbConfig == nil || !(pgschema.Missing(err) || errors.As(err, &pgErr) && pgErr.Code == "42703") {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, cerr := pgx.ConnectConfig(ctx, a.dbConfig.Copy())
	if cerr != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	v, cerr := migrations.Compare(ctx, conn, a.schema())
	if cerr != nil || len(v.Pending) == 0 {
		return err
	}
	return badInput("schema", fmt.Sprintf("%s (%s)", v.Behind(a.schema()), oneLine(err.Error())))
}

func (a *app) writeJSON(v any) {
	enc := json.NewEncoder(a.stdout)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// newFlags returns a flag set that reports errors as bad input instead of
// exiting, with the common --database-url flag.
func (a *app) newFlags(name string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("gateway "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dbURL := fs.String("database-url", a.getenv("GATEWAY_DATABASE_URL"), "PostgreSQL URL (default $GATEWAY_DATABASE_URL)")
	a.dbQueryMode = fs.String("database-query-mode", cmp.Or(a.getenv("GATEWAY_DATABASE_QUERY_MODE"), queryModeDefault),
		"how pgx sends statements on --database-url: cache_statement (server-side prepared statements: PostgreSQL itself, or PgBouncer 1.21+ with max_prepared_statements) or, through a pooler in transaction mode, exec (or simple_protocol, cache_describe), which also keeps LISTEN and the migration lock off --database-url; a default_query_exec_mode in the URL wins (default $GATEWAY_DATABASE_QUERY_MODE, else cache_statement)")
	a.dbDirectURL = fs.String("database-direct-url", a.getenv("GATEWAY_DATABASE_DIRECT_URL"),
		"PostgreSQL itself, when --database-url is a pooler in transaction mode: for what needs a session (LISTEN, the migration lock); empty: LISTEN falls back to polling and gateway migrate refuses (default $GATEWAY_DATABASE_DIRECT_URL)")
	a.schemaFlag(fs)
	return fs, dbURL
}

// schemaFlag adds --schema, the PostgreSQL schema fencegate's tables live
// in (default $GATEWAY_SCHEMA, else fencegate); parse checks it.
func (a *app) schemaFlag(fs *flag.FlagSet) {
	a.schemaName = fs.String("schema", cmp.Or(a.getenv("GATEWAY_SCHEMA"), pgschema.Default),
		"PostgreSQL schema of fencegate's tables and functions (default $GATEWAY_SCHEMA, else "+pgschema.Default+"): a-z, 0-9, _, at most 40 bytes")
}

// schema is the --schema of the command being run.
func (a *app) schema() string {
	if a.schemaName == nil {
		return pgschema.Default
	}
	return *a.schemaName
}

// parse parses args; on --help (-h) it prints the command's help on
// stdout and returns exit 0.
func (a *app) parse(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			// A default may come from the environment (--database-url's
			// is $GATEWAY_DATABASE_URL): print secrets as set or not, URLs
			// without their credentials.
			fs.VisitAll(func(f *flag.Flag) {
				switch {
				case f.DefValue == "":
				case secretFlags[f.Name]:
					f.DefValue = "(set)"
				default:
					f.DefValue = redactFlagURL(f.Name, f.DefValue)
				}
			})
			a.printCommandHelp(fs)
			return exitOK, false
		}
		return a.fail(badInput(flagParseError(fs, err))), false
	}
	if err := pgschema.Check(a.schema()); err != nil {
		return a.fail(badInput("schema", "--"+err.Error())), false
	}
	return 0, true
}

// parseOnly is parse for a command that takes flags only: a positional
// argument is bad input.
func (a *app) parseOnly(fs *flag.FlagSet, args []string) (int, bool) {
	if code, ok := a.parse(fs, args); !ok {
		return code, false
	}
	if err := noArgs(fs); err != nil {
		return a.fail(err), false
	}
	return 0, true
}

// parseWithEnv is parse for the long-running commands (run, dev): every
// flag not given on the command line is also read from the environment, as
// GATEWAY_<NAME> (--db-max-conns: GATEWAY_DB_MAX_CONNS). The command line
// wins over the environment, the environment over the default. A value
// that does not parse is bad input naming the flag's field and the
// variable — never echoing the value, which may be a secret.
//
// Flags named in except are not read from the environment (dev ignores
// $GATEWAY_DATABASE_URL and $GATEWAY_NATS_URL on purpose: a shell set up
// for production must not point a throwaway environment at it).
func (a *app) parseWithEnv(fs *flag.FlagSet, args []string, except ...string) (int, bool) {
	if code, ok := a.parse(fs, args); !ok {
		return code, false
	}
	if err := a.setFromEnv(fs, func(name string) bool { return !slices.Contains(except, name) }); err != nil {
		return a.fail(err), false
	}
	if err := pgschema.Check(a.schema()); err != nil {
		return a.fail(badInput("schema", "--"+err.Error())), false
	}
	return 0, true
}

// setFromEnv sets each flag of fs that the command line did not give and
// that read accepts from its GATEWAY_<NAME> variable, when set: what
// parseWithEnv does for every flag of run and dev, and the other commands
// for the flags they share with run whose variable they take too
// (--failover-epoch-jump, --allow-fsync-off). A value that does not parse
// is bad input naming the flag's field and the variable, never echoing
// the value.
func (a *app) setFromEnv(fs *flag.FlagSet, read func(name string) bool) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var bad *cliError
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || bad != nil || !read(f.Name) {
			return
		}
		env := EnvName(f.Name)
		v := a.getenv(env)
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			msg := fmt.Sprintf("$%s is not a valid value for --%s", env, f.Name)
			if hint := valueHint(f); hint != "" {
				msg += ": " + hint
			}
			bad = badInput(strings.ReplaceAll(f.Name, "-", "_"), msg)
		}
	})
	if bad != nil {
		return bad
	}
	return nil
}

// parseOnlyWithEnv is parseOnly for a command that shares flags with run
// and takes their variables too (env: those flags' names), as
// parseWithEnv reads them.
func (a *app) parseOnlyWithEnv(fs *flag.FlagSet, args []string, env ...string) (int, bool) {
	if code, ok := a.parseOnly(fs, args); !ok {
		return code, false
	}
	if err := a.setFromEnv(fs, func(name string) bool { return slices.Contains(env, name) }); err != nil {
		return a.fail(err), false
	}
	return 0, true
}

// secretFlags are printed by --print-config only as whether they are set.
var secretFlags = map[string]bool{"smtp-password": true, "webhook-secret": true, "s3-receipt-secret": true}

// redactFlagURL hides the credentials in a URL-valued flag's value: every
// flag whose name says it holds URLs (-url, -endpoint) and any value that
// looks like one (scheme://), so that a new URL flag is covered without
// being listed. --database-url is one URL (libpq's multi-host form has
// commas); the others may be comma-separated lists (--nats-url's seeds).
// Other values pass as they are.
func redactFlagURL(name, v string) string {
	switch {
	case v == "":
		return v
	case name == "database-url" || name == "database-direct-url":
		return redactURL(v)
	case strings.HasSuffix(name, "-url") || strings.HasSuffix(name, "-endpoint") || strings.Contains(v, "://"):
		return redactNATS(v)
	}
	return v
}

// printConfig prints every flag's effective value — from the command line,
// the environment (GATEWAY_<FLAG>) or its default — as one JSON object
// {"config": {flag: value}}, without connecting to anything. Secrets are
// redacted: passwords as "(set)", credentials in URLs.
func (a *app) printConfig(fs *flag.FlagSet) int {
	cfg := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		v := f.Value.String()
		switch {
		case f.Name == "print-config":
			return
		case secretFlags[f.Name]:
			if v != "" {
				v = "(set)"
			}
		default:
			v = redactFlagURL(f.Name, v)
		}
		cfg[f.Name] = v
	})
	a.writeJSON(map[string]any{"config": cfg})
	return exitOK
}

// logFlags adds --log-level and --log-format (run, dev). The function it
// returns, called once the flags are parsed, builds the slog logger on
// stderr they describe: text (the default) or JSON lines for log
// pipelines.
func (a *app) logFlags(fs *flag.FlagSet) func() (*slog.Logger, error) {
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	format := fs.String("log-format", "text", "log format on stderr: text or json (slog)")
	return func() (*slog.Logger, error) {
		var l slog.Level
		if err := l.UnmarshalText([]byte(*level)); err != nil {
			return nil, badInput("log_level", "--log-level must be debug, info, warn or error")
		}
		opts := &slog.HandlerOptions{Level: l}
		switch *format {
		case "text", "":
			return slog.New(slog.NewTextHandler(a.stderr, opts)), nil
		case "json":
			// Durations as the text format writes them ("30s"), not as
			// slog's JSON default, a bare number of nanoseconds.
			opts.ReplaceAttr = func(_ []string, attr slog.Attr) slog.Attr {
				if attr.Value.Kind() == slog.KindDuration {
					attr.Value = slog.StringValue(attr.Value.Duration().String())
				}
				return attr
			}
			// A record logged with a context inside a span carries its
			// trace_id and span_id, to join the line to its trace.
			return slog.New(otelsetup.NewLogHandler(slog.NewJSONHandler(a.stderr, opts))), nil
		}
		return nil, badInput("log_format", "--log-format must be text or json")
	}
}

// EnvName is the environment variable of a flag of run and dev:
// GATEWAY_ and the flag's name in upper case, '-' as '_'.
func EnvName(flagName string) string {
	return "GATEWAY_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// connect opens a pool and checks it can reach the database, with a bounded
// wait, so an unreachable database is one clear line and exit 1. The pool
// has pgxpool's default size (or the URL's pool_max_conns).
func (a *app) connect(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	return a.connectSized(ctx, dbURL, 0)
}

// connectSized is connect with a pool of maxConns connections at most
// (0: pgxpool's default). A pool_max_conns in the URL wins over maxConns:
// it is the operator's explicit choice for this one database.
func (a *app) connectSized(ctx context.Context, dbURL string, maxConns int32) (*pgxpool.Pool, error) {
	mode, err := a.queryMode()
	if err != nil {
		return nil, err
	}
	if dbURL == "" {
		return nil, badInput("database_url", "no database: set GATEWAY_DATABASE_URL or pass --database-url")
	}
	cfg, err := parseDBURL("database_url", dbURL)
	if err != nil {
		return nil, err
	}
	if !urlSets(dbURL, "default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = mode
	}
	return a.open(ctx, cfg, dbURL, maxConns)
}

// connectDirect opens a pool of maxConns on --database-direct-url, with
// pgx's default query mode (it is PostgreSQL itself), or returns nil
// when no direct URL is given. sameAs, when not nil, is the pool on
// --database-url: the direct URL must reach the same database, or what
// goes there (LISTEN, migrate) would act on another one.
func (a *app) connectDirect(ctx context.Context, maxConns int32, sameAs *pgxpool.Pool) (*pgxpool.Pool, error) {
	if a.dbDirectURL == nil || *a.dbDirectURL == "" {
		return nil, nil
	}
	cfg, err := parseDBURL("database_direct_url", *a.dbDirectURL)
	if err != nil {
		return nil, err
	}
	direct, err := a.open(ctx, cfg, *a.dbDirectURL, maxConns)
	if err != nil || sameAs == nil {
		return direct, err
	}
	if err := sameDatabase(ctx, direct, sameAs); err != nil {
		direct.Close()
		return nil, err
	}
	return direct, nil
}

// sameDatabase checks that direct and pooled reach one database: the same
// current_database() and, where the role may read it, the same cluster
// (pg_control_system's system identifier). Through a pooler both answers
// are the server's own, whatever name the pooler gives the database.
func sameDatabase(ctx context.Context, direct, pooled *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	identity := func(p *pgxpool.Pool) (db, sysid string, err error) {
		if err := p.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
			return "", "", err
		}
		// A role without pg_monitor (or superuser) may not read it: the
		// database's name is then all that is compared.
		var id int64
		if err := p.QueryRow(ctx, `SELECT system_identifier FROM pg_control_system()`).Scan(&id); err == nil {
			sysid = strconv.FormatInt(id, 10)
		}
		return db, sysid, nil
	}
	ddb, dsys, err := identity(direct)
	if err != nil {
		return unavailable("database at --database-direct-url: " + oneLine(err.Error()))
	}
	pdb, psys, err := identity(pooled)
	if err != nil {
		return unavailable("database at --database-url: " + oneLine(err.Error()))
	}
	if ddb != pdb || (dsys != "" && psys != "" && dsys != psys) {
		return badInput("database_direct_url", fmt.Sprintf("--database-direct-url reaches database %q (cluster %s) and --database-url %q (cluster %s): "+
			"the direct URL must name the same database, PostgreSQL itself behind the pooler", ddb, cmp.Or(dsys, "unknown"), pdb, cmp.Or(psys, "unknown")))
	}
	return nil
}

// open opens a pool from cfg (parsed from dbURL) and checks it reaches a
// primary.
func (a *app) open(ctx context.Context, cfg *pgxpool.Config, dbURL string, maxConns int32) (*pgxpool.Pool, error) {
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	if maxConns > 0 && !urlSets(dbURL, "pool_max_conns") {
		cfg.MaxConns = maxConns
	}
	// Epochs and fenced writes must come from the primary: every pooled
	// connection checks pg_is_in_recovery() once when it is made.
	lease.RequirePrimary(cfg)
	// Everything this process commits that decides authority or ownership
	// also raises synchronous_commit per transaction; the session setting is
	// a second line of defence for statements outside those paths.
	durable.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, unavailable("database: " + withoutPassword(oneLine(err.Error()), cfg.ConnConfig.Password))
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		if errors.Is(err, lease.ErrStandby) {
			return nil, unavailable(fmt.Sprintf("database at %s: %s", redactURL(dbURL), lease.ErrStandby))
		}
		if isPoolerPreparedStatement(err) {
			return nil, unavailable(fmt.Sprintf("database at %s: %s (a pooler in transaction mode in front? give --database-query-mode exec)",
				redactURL(dbURL), withoutPassword(oneLine(err.Error()), cfg.ConnConfig.Password)))
		}
		return nil, unavailable(fmt.Sprintf("database unreachable at %s: %s", redactURL(dbURL), withoutPassword(oneLine(err.Error()), cfg.ConnConfig.Password)))
	}
	a.dbConfig = cfg.ConnConfig.Copy()
	return pool, nil
}

// parseDBURL parses the connection string of --database-url or
// --database-direct-url (field names it) as pgx does. No part of its
// password may show in any output, so:
//
//   - a URL that pgx would read otherwise than a URL parser (the
//     redaction's) is refused before it is used (ambiguousDBURL): pgx's
//     errors would name a host, database or user holding a piece of the
//     password, after a prefix claiming it hidden;
//   - a string that does not parse is refused naming the field and the
//     kind of problem only (parseProblem): pgx's own message quotes it,
//     masking "password=" up to a space only (not "password = x", nor
//     an escaped space), and its inner errors quote the pieces they
//     could not read.
func parseDBURL(field, raw string) (*pgxpool.Config, error) {
	name := "--" + strings.ReplaceAll(field, "_", "-")
	if ambiguousDBURL(raw) {
		return nil, badInput(field, name+" has an '@' that does not end its user name and password "+
			"(pgx ends the user info at the first '@' before any '/', a URL parser at the last): percent-encode "+
			"'@' in the user name, password or database name as %40, and '/', '?' and '#' in the password as %2F, %3F and %23 "+
			"(the value is not shown: it may hold a password)")
	}
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, badInput(field, "cannot parse "+name+": "+parseProblem(err)+" (the value is not shown: it may hold a password)")
	}
	return cfg, nil
}

// ambiguousDBURL reports whether raw is a postgres:// URL that pgx (like
// libpq) reads otherwise than net/url: pgx ends the user info at the first
// '@' before the first '/', even past a '?' or '#'; net/url at the last
// '@' before the first '/', '?' or '#'. It is so when more than one '@'
// precedes the first '/', when that '@' follows a '?' or a '#', or when an
// '@' is in the path (a password with an unencoded '/': pgx reads no user
// info, and takes the password's tail for the database). A key=value
// string has one reading, pgx's.
func ambiguousDBURL(raw string) bool {
	rest, ok := strings.CutPrefix(raw, "postgresql://")
	if !ok {
		if rest, ok = strings.CutPrefix(raw, "postgres://"); !ok {
			return false
		}
	}
	authority, path, _ := strings.Cut(rest, "/")
	if i := strings.IndexByte(authority, '@'); i >= 0 && (strings.Count(authority, "@") > 1 || strings.ContainsAny(authority[:i], "?#")) {
		return true
	}
	path, _, _ = strings.Cut(path, "?")
	return strings.Contains(path, "@")
}

// pgxParseProblems are the messages of pgx's ParseConfigError that name
// the kind of problem and hold no part of the connection string (those
// that quote a value are cut at it: the message up to it is shown).
var pgxParseProblems = []string{
	"failed to parse as URL", "failed to parse as keyword/value", "failed to read service",
	"invalid port", "invalid connect_timeout", "invalid sslcertmode", "invalid require_auth",
	"failed to configure TLS", "invalid default_query_exec_mode",
	"min_protocol_version cannot be greater than max_protocol_version",
	"invalid min_protocol_version", "invalid max_protocol_version",
	"unknown target_session_attrs value", "unknown channel_binding value",
	"cannot parse statement_cache_capacity", "cannot parse description_cache_capacity",
	"cannot parse pool_max_conns", "pool_max_conns too small", "cannot parse pool_min_conns",
	"cannot parse pool_min_idle_conns", "cannot parse pool_max_conn_lifetime_jitter", "cannot parse pool_max_conn_lifetime",
	"cannot parse pool_max_conn_idle_time", "cannot parse pool_health_check_period", "cannot parse pool_ping_timeout",
	"could not match",
}

// pgxTLSProblems are inner errors of "failed to configure TLS" that hold
// no part of the connection string.
var pgxTLSProblems = []string{"sslmode is invalid", `both "sslcert" and "sslkey" are required`, "failed to decode sslkey", "unable to add CA to cert pool"}

// parseProblem is the kind of problem pgx found in a connection string,
// taken from pgxParseProblems and never from the error's text: that
// quotes the string, and its inner errors the pieces they could not read.
func parseProblem(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return "not a connection string"
	}
	// "cannot parse `<the string, masked>`: <problem>[ (<inner error>)]":
	// the problem follows the last "`: ".
	text := pe.Error()
	inner := errors.Unwrap(pe)
	if inner != nil {
		text = strings.TrimSuffix(text, " ("+inner.Error()+")")
	}
	i := strings.LastIndex(text, "`: ")
	if i < 0 {
		return "not a connection string"
	}
	text = text[i+len("`: "):]
	for _, p := range pgxParseProblems {
		if !strings.HasPrefix(text, p) {
			continue
		}
		switch {
		case p == "could not match":
			return "as many ports as hosts are needed"
		case p == "failed to configure TLS" && inner != nil && slices.Contains(pgxTLSProblems, inner.Error()):
			return p + ": " + inner.Error()
		}
		return p
	}
	return "not a connection string"
}

// withoutPassword is msg without password, should a driver's or server's
// text ever quote it (a password shorter than 4 bytes is not looked for:
// it would blank out ordinary words).
func withoutPassword(msg, password string) string {
	if len(password) < 4 {
		return msg
	}
	return strings.ReplaceAll(msg, password, "xxxxx")
}

// isPoolerPreparedStatement reports whether err is what pgx's statement
// cache meets through a pooler in transaction mode: its prepared statement
// missing (26000) or there twice (42P05) on another server connection.
func isPoolerPreparedStatement(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P05" || pe.Code == "26000") && strings.Contains(pe.Message, `"stmtcache_`)
}

// queryModeDefault is --database-query-mode's default: pgx's own.
const queryModeDefault = "cache_statement"

// queryModes are the values of --database-query-mode. describe_exec is
// left out: through a pooler in transaction mode its describe and its
// execute may reach different server connections, and on PostgreSQL
// itself cache_statement does what it does in fewer round trips.
var queryModes = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// queryModeName is mode as --database-query-mode spells it (pgx's own
// String is "cache statement"), for the logs.
func queryModeName(mode pgx.QueryExecMode) string {
	for name, m := range queryModes {
		if m == mode {
			return name
		}
	}
	return mode.String()
}

// queryMode is the command's --database-query-mode.
func (a *app) queryMode() (pgx.QueryExecMode, error) {
	v := queryModeDefault
	if a.dbQueryMode != nil {
		v = *a.dbQueryMode
	}
	m, ok := queryModes[v]
	if !ok {
		return 0, badInput("database_query_mode", fmt.Sprintf("--database-query-mode must be cache_statement, exec, simple_protocol or cache_describe, got %q", v))
	}
	return m, nil
}

// transactionPooled reports whether pool's query mode is one for a pooler
// in transaction mode: then nothing that needs a session goes through it.
func transactionPooled(pool *pgxpool.Pool) bool {
	return pool.Config().ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement
}

// listenPool is the pool the command LISTENs on: --database-direct-url's
// (opened here, with one connection, checked to reach pool's database),
// nil when there is none. The caller closes it.
func (a *app) listenPool(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Pool, error) {
	return a.connectDirect(ctx, 2, pool)
}

// withOperator connects to the database for an operator's command (ls,
// retry, cancel, resolve, lease history), calls do with the operator API
// on it, and closes the pool.
func withOperator[T any](ctx context.Context, a *app, dbURL string, do func(*operator.Operator) (T, error)) (T, error) {
	var zero T
	pool, err := a.connect(ctx, dbURL)
	if err != nil {
		return zero, err
	}
	defer pool.Close()
	op, err := operator.New(pool, a.schema())
	if err != nil {
		return zero, err
	}
	return do(op)
}

// fsyncFlag adds --allow-fsync-off to a command that starts on a database
// (run, migrate, dev); $GATEWAY_ALLOW_FSYNC_OFF=true sets it when the
// command line does not: run and dev read it as every flag's variable,
// migrate with parseOnlyWithEnv, so that a value that is not a boolean is
// exit 2 naming allow_fsync_off for each of them.
func (a *app) fsyncFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("allow-fsync-off", false, "start even when PostgreSQL runs with fsync=off (throwaway test servers only: a crash can then lose acknowledged grants and intents) (default $GATEWAY_ALLOW_FSYNC_OFF)")
}

// requireFsync refuses a server running with fsync=off unless allowed:
// there, no commit is durable whatever synchronous_commit says, so an
// acknowledged grant can be lost in a crash and its epoch handed out again.
func (a *app) requireFsync(ctx context.Context, pool *pgxpool.Pool, allow bool) error {
	var fsync string
	if err := pool.QueryRow(ctx, `SELECT current_setting('fsync')`).Scan(&fsync); err != nil {
		return unavailable("database: read fsync: " + oneLine(err.Error()))
	}
	if fsync == "on" {
		return nil
	}
	if allow {
		fmt.Fprintln(a.stderr, "gateway: warning: PostgreSQL runs with fsync=off (allowed by --allow-fsync-off): a crash can lose acknowledged grants and intents")
		return nil
	}
	return errmap.New(errmap.UnsafeDatabase, "PostgreSQL runs with fsync=off: a crash could lose acknowledged grants and intents and hand one epoch to two holders; turn fsync on (or, for a throwaway test server, pass --allow-fsync-off)")
}

// redactURL is raw as it may be shown (redactParsed); one that does not
// parse, or that pgx reads otherwise than net/url (ambiguousDBURL), is not
// shown at all.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || ambiguousDBURL(raw) {
		return "(configured URL)"
	}
	return redactParsed(u)
}

// redactLocation is a Location header's URL, absolute or relative, without
// its credentials; one that does not parse is not shown.
func redactLocation(loc string) string {
	u, err := url.Parse(loc)
	if err != nil {
		return "(an unparsable Location)"
	}
	return redactParsed(u)
}

// redactParsed is u as it may be shown: without the userinfo password (a
// NATS token user name too) and with every secret query parameter's value
// replaced.
func redactParsed(u *url.URL) string {
	// A NATS token travels as the user name alone (nats://TOKEN@host).
	if u.User != nil {
		_, hasPass := u.User.Password()
		if !hasPass && u.User.Username() != "" && slices.Contains([]string{"nats", "tls", "ws", "wss"}, u.Scheme) {
			u.User = url.User("xxxxx")
		}
	}
	// libpq takes credentials as parameters too (?password=, ?sslpassword=).
	// A pair that does not parse (password=PW%zz) is dropped by
	// ParseQuery: such a query is shown re-encoded, without it, never raw.
	if q, err := url.ParseQuery(u.RawQuery); len(q) > 0 || err != nil {
		changed := err != nil
		for k := range q {
			if secretParam(k) {
				q.Set(k, "xxxxx")
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	return u.Redacted()
}

// secretParam reports whether a URL query parameter carries a credential.
func secretParam(name string) bool {
	n := strings.ToLower(name)
	// A signed URL's signature (S3's X-Amz-Signature, an Azure SAS's sig)
	// is a credential too: whoever holds the URL may use it.
	if n == "sig" {
		return true
	}
	for _, s := range []string{"password", "passwd", "pass", "token", "secret", "key", "credential", "auth", "signature"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// noArgs rejects stray positional arguments.
func noArgs(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return badInput("args", fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	return nil
}
