package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/durable"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Exit codes, part of the public contract.
const (
	exitOK       = 0
	exitInternal = 1
	exitBadInput = 2
	exitStale    = 3
	exitHeld     = 4
	exitConflict = 5
)

// cliError is an error with its exit code and the JSON error object.
type cliError struct {
	exit    int
	code    string
	message string
	extra   map[string]any
}

func (e *cliError) Error() string { return e.message }

func badInput(field, msg string) *cliError {
	return &cliError{exit: exitBadInput, code: "invalid_input", message: msg, extra: map[string]any{"field": field}}
}

// classify maps an error to its exit code and JSON error body.
func classify(err error) *cliError {
	var ce *cliError
	if errors.As(err, &ce) {
		return ce
	}
	var (
		ostale *outbox.StaleEpochError
		lstale *lease.StaleEpochError
		held   *lease.HeldError
		busy   *lease.BusyError
		conf   *outbox.ConflictError
		oinv   *outbox.ValidationError
		linv   *lease.InvalidError
	)
	switch {
	case errors.As(err, &ostale):
		return &cliError{exit: exitStale, code: "stale_epoch", message: err.Error(), extra: map[string]any{
			"resource": ostale.Resource, "supplied_epoch": ostale.Supplied, "current_epoch": ostale.Current}}
	case errors.As(err, &lstale):
		return &cliError{exit: exitStale, code: "stale_epoch", message: err.Error(), extra: map[string]any{
			"resource": lstale.Resource, "supplied_epoch": lstale.Supplied, "current_epoch": lstale.Current}}
	case errors.As(err, &held):
		return &cliError{exit: exitHeld, code: "lease_held", message: err.Error(), extra: map[string]any{
			"resource": held.Resource, "holder": held.Holder, "current_epoch": held.Epoch, "expires_at": held.ExpiresAt}}
	case errors.As(err, &busy):
		// Retryable, nothing granted: the control row stayed locked by an
		// open transaction past --lock-timeout.
		return &cliError{exit: exitInternal, code: "busy", message: err.Error(), extra: map[string]any{"resource": busy.Resource}}
	case errors.As(err, &conf):
		return &cliError{exit: exitConflict, code: "conflict", message: err.Error(), extra: map[string]any{
			"resource": conf.Resource, "operation_id": conf.OperationID, "intent_id": conf.IntentID}}
	case errors.As(err, &oinv):
		return badInput(oinv.Field, err.Error())
	case errors.As(err, &linv):
		return badInput(linv.Field, err.Error())
	case errors.Is(err, lease.ErrStandby):
		return &cliError{exit: exitInternal, code: "unavailable", message: oneLine(err.Error())}
	case errors.Is(err, outbox.ErrNotFound):
		return &cliError{exit: exitBadInput, code: "not_found", message: err.Error()}
	}
	code := "internal"
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) || pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) ||
		(!errors.As(err, &pgErr) && isNetErr(err)) {
		code = "unavailable"
	}
	return &cliError{exit: exitInternal, code: code, message: oneLine(err.Error())}
}

func isNetErr(err error) bool {
	s := err.Error()
	return strings.Contains(s, "connect") || strings.Contains(s, "dial") || strings.Contains(s, "connection")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// fail writes the error object on stdout and a one-line message on stderr,
// and returns the exit code.
func (a *app) fail(err error) int {
	ce := classify(err)
	body := map[string]any{"code": ce.code, "message": ce.message}
	for k, v := range ce.extra {
		body[k] = v
	}
	a.writeJSON(map[string]any{"error": body})
	fmt.Fprintf(a.stderr, "gateway: %s\n", oneLine(ce.message))
	return ce.exit
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
	return fs, dbURL
}

// parse parses args; on --help it prints the flags and returns exit 0.
func (a *app) parse(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(a.stderr)
			fs.PrintDefaults()
			return exitOK, false
		}
		return a.fail(badInput("flags", err.Error())), false
	}
	return 0, true
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
	if dbURL == "" {
		return nil, badInput("database_url", "no database: set GATEWAY_DATABASE_URL or pass --database-url")
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, badInput("database_url", "cannot parse the database URL: "+redactErr(err))
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	if maxConns > 0 && !urlSetsMaxConns(dbURL) {
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
		return nil, &cliError{exit: exitInternal, code: "unavailable", message: "database: " + oneLine(err.Error())}
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		if errors.Is(err, lease.ErrStandby) {
			return nil, &cliError{exit: exitInternal, code: "unavailable",
				message: fmt.Sprintf("database at %s: %s", redactURL(dbURL), lease.ErrStandby)}
		}
		return nil, &cliError{exit: exitInternal, code: "unavailable",
			message: fmt.Sprintf("database unreachable at %s: %s", redactURL(dbURL), oneLine(err.Error()))}
	}
	return pool, nil
}

// fsyncFlag adds --allow-fsync-off to a command that starts on a database
// (run, migrate, dev); $GATEWAY_ALLOW_FSYNC_OFF=true sets its default.
func (a *app) fsyncFlag(fs *flag.FlagSet) *bool {
	def, _ := strconv.ParseBool(a.getenv("GATEWAY_ALLOW_FSYNC_OFF"))
	return fs.Bool("allow-fsync-off", def, "start even when PostgreSQL runs with fsync=off (throwaway test servers only: a crash can then lose acknowledged grants and intents) (default $GATEWAY_ALLOW_FSYNC_OFF)")
}

// requireFsync refuses a server running with fsync=off unless allowed:
// there, no commit is durable whatever synchronous_commit says, so an
// acknowledged grant can be lost in a crash and its epoch handed out again.
func (a *app) requireFsync(ctx context.Context, pool *pgxpool.Pool, allow bool) error {
	var fsync string
	if err := pool.QueryRow(ctx, `SELECT current_setting('fsync')`).Scan(&fsync); err != nil {
		return &cliError{exit: exitInternal, code: "unavailable", message: "database: read fsync: " + oneLine(err.Error())}
	}
	if fsync == "on" {
		return nil
	}
	if allow {
		fmt.Fprintln(a.stderr, "gateway: warning: PostgreSQL runs with fsync=off (allowed by --allow-fsync-off): a crash can lose acknowledged grants and intents")
		return nil
	}
	return &cliError{exit: exitInternal, code: "unsafe_database", message: "PostgreSQL runs with fsync=off: a crash could lose acknowledged grants and intents and hand one epoch to two holders; turn fsync on (or, for a throwaway test server, pass --allow-fsync-off)"}
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(configured URL)"
	}
	return u.Redacted()
}

func redactErr(err error) string {
	// pgx parse errors may echo the URL, password included.
	msg := err.Error()
	if i := strings.Index(msg, "://"); i >= 0 {
		return "invalid URL"
	}
	return msg
}

// noArgs rejects stray positional arguments.
func noArgs(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return badInput("args", fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	return nil
}
