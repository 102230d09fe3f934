package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/deployment"
	"github.com/fencegate/fencegate/internal/failpoint"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/migrations"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
	"github.com/fencegate/fencegate/policy"
)

func cmdMigrate(ctx context.Context, a *app, args []string) int {
	fs, dbURL := a.newFlags("migrate")
	allowFsyncOff := a.fsyncFlag(fs)
	moveFrom := fs.String("move-from", "", "first move an install from this schema (public: an install from before schemas) into --schema, in one transaction; stop every gateway process and worker of the database first. A schema without an install is refused (exit 2 naming move_from), with nothing moved or created")
	allowUnsafe := fs.Bool("allow-unsafe-schema", false, "install even where roles other than this one can create objects in --schema (refused otherwise, exit 2 naming schema): only when every such role is trusted as much as this one, since fencegate's SQL functions run with this role's rights")
	nsFlag := fs.String("namespace", "", "record this as the deployment's namespace on NATS (default $GATEWAY_NAMESPACE, else the recorded one, first derived from the cluster's system identifier and the database's name); unique per NATS: a-z, 0-9, '-', '_', at most 32")
	if code, ok := a.parseOnlyWithEnv(fs, args, "allow-fsync-off"); !ok {
		return code
	}
	var ns wire.Namespace
	if v := cmp.Or(*nsFlag, a.getenv("GATEWAY_NAMESPACE")); v != "" {
		var err error
		if ns, err = wire.ParseNamespace(v); err != nil {
			return a.fail(badInput("namespace", "--namespace "+err.Error()))
		}
	}
	pool, err := a.migrationPool(ctx, *dbURL)
	if err != nil {
		return a.fail(err)
	}
	defer pool.Close()
	if err := a.requireFsync(ctx, pool, *allowFsyncOff); err != nil {
		return a.fail(err)
	}
	var moved []string
	if *moveFrom != "" {
		if err := pgschema.Check(*moveFrom); err != nil {
			return a.fail(badInput("move_from", "--move-from: "+strings.TrimPrefix(err.Error(), "schema: ")))
		}
		if *moveFrom == a.schema() {
			return a.fail(badInput("move_from", fmt.Sprintf("--move-from %s is --schema itself", *moveFrom)))
		}
		// Before Up: Move refuses a --move-from without an install (and a
		// --schema holding one) with nothing created, and Up, which would
		// install afresh where a typo pointed, must not run then.
		if moved, err = migrations.Move(ctx, pool, *moveFrom, a.schema()); err != nil {
			var inv *fenceerr.InvalidError
			if errors.As(err, &inv) {
				// Move names its arguments; the command, its flags.
				switch inv.Field {
				case "from":
					return a.fail(badInput("move_from", "--move-from: "+inv.Message))
				case "to":
					return a.fail(badInput("schema", "--schema: "+inv.Message))
				}
			}
			return a.fail(err)
		}
		fmt.Fprintf(a.stderr, "gateway migrate: moved %d objects from schema %s to %s\n", len(moved), *moveFrom, a.schema())
	}
	applied, err := migrations.Up(ctx, pool, migrations.Config{Schema: a.schema(), AllowUnsafeSchema: *allowUnsafe})
	var elsewhere *migrations.ElsewhereError
	var unsafe *migrations.UnsafeSchemaError
	var newer *migrations.NewerSchemaError
	if errors.As(err, &elsewhere) || errors.As(err, &unsafe) {
		return a.fail(badInput("schema", err.Error()))
	}
	if errors.As(err, &newer) {
		// Nothing changed, and nothing is wrong with the schema: this is
		// an older build (a rollback, a migrate step run again). Said, and
		// the rest (the version, the namespace) goes on.
		fmt.Fprintf(a.stderr, "gateway migrate: warning: %v\n", newer)
		err = nil
	}
	if err != nil {
		return a.fail(err)
	}
	version, err := migrations.Version(ctx, pool, a.schema())
	if err != nil {
		return a.fail(err)
	}
	if applied == nil {
		applied = []migrations.Applied{}
	}
	if ns != "" {
		old, err := deployment.Set(ctx, pool, a.schema(), ns)
		if err != nil {
			return a.fail(err)
		}
		if old != ns {
			// Relayed intents of the old namespace are relayed again under
			// the new one after the relay timeout.
			fmt.Fprintf(a.stderr, "gateway migrate: namespace %s (was %s): restart every gateway process of this database\n", ns, old)
		}
	}
	info, err := deployment.Resolve(ctx, pool, a.schema())
	if err != nil {
		return a.fail(err)
	}
	if moved == nil {
		moved = []string{}
	}
	a.writeJSON(map[string]any{"version": version, "applied": applied, "schema": a.schema(), "moved": moved,
		"namespace": info.Namespace, "namespace_explicit": info.Explicit})
	return exitOK
}

func requireFlag(field, v string) error {
	if v == "" {
		return badInput(field, fmt.Sprintf("--%s is required", field))
	}
	return nil
}

// checkResource checks a --resource flag: given, and a valid resource id.
func checkResource(resource string) error {
	if err := requireFlag("resource", resource); err != nil {
		return err
	}
	return lease.ValidateResource(resource)
}

// lockTimeoutFlag adds --lock-timeout, the issuer's bound on a grant's wait
// for the resource's control-row lock (lease.WithLockTimeout); then says
// what giving up looks like to the flag's command.
func lockTimeoutFlag(fs *flag.FlagSet, then string) *time.Duration {
	return fs.Duration("lock-timeout", lease.DefaultLockTimeout,
		"give up ("+then+") when the resource's control row stays locked this long, e.g. by a worker paused inside a transaction; 0: wait without a bound")
}

// lockTimeoutExit is what giving up looks like to a one-shot command.
const lockTimeoutExit = "exit 1, busy"

// failoverJumpFlag adds --failover-epoch-jump, how far the first grant
// after a failover raises every epoch (lease.WithFailoverEpochJump). Every
// command that has it reads $GATEWAY_FAILOVER_EPOCH_JUMP when the command
// line does not give it (run as every flag's variable; lease acquire and
// epoch advance with parseOnlyWithEnv), so that every issuer of a
// database can be given the same value in one place.
func failoverJumpFlag(fs *flag.FlagSet) *int64 {
	return fs.Int64("failover-epoch-jump", lease.DefaultFailoverEpochJump,
		"after a failover (the database's timeline grew), the first grant raises every resource's epoch by this much, "+
			"past anything the old primary can have granted: grants/s × the longest replication lag in seconds × a safety factor; 0: no raise (synchronous replication); "+
			"give every issuer of the database the same value (default $GATEWAY_FAILOVER_EPOCH_JUMP, else "+strconv.FormatInt(lease.DefaultFailoverEpochJump, 10)+")")
}

// checkFailoverJump checks a --failover-epoch-jump flag: 0 to
// lease.MaxEpoch.
func checkFailoverJump(n int64) error {
	if n < 0 || n > lease.MaxEpoch {
		return badInput("failover_epoch_jump", fmt.Sprintf("--failover-epoch-jump must be between 0 and %d (2^53), got %d", lease.MaxEpoch, n))
	}
	return nil
}

// checkEpoch checks an --epoch flag: 1 to lease.MaxEpoch (2^53).
func checkEpoch(epoch int64) error {
	if epoch < 1 || epoch > lease.MaxEpoch {
		return badInput("epoch", fmt.Sprintf("--epoch is required and must be between 1 and %d (2^53), got %d", lease.MaxEpoch, epoch))
	}
	return nil
}

// checkLockTimeout checks a --lock-timeout flag.
func checkLockTimeout(d time.Duration) error {
	if d < 0 {
		return badInput("lock_timeout", fmt.Sprintf("--lock-timeout must not be negative, got %s", d))
	}
	return nil
}

// outboxLockTimeout is --lock-timeout as outbox.Config.LockTimeout, where
// 0 is the default and a negative value waits without a bound (the flag's
// 0).
func outboxLockTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// principalFlag adds --principal: who a grant or an enqueue is made as,
// under the rule set (docs/policy.md).
func (a *app) principalFlag(fs *flag.FlagSet) *string {
	return fs.String("principal", a.getenv("GATEWAY_PRINCIPAL"),
		"the principal of the rule set this is done as (default $GATEWAY_PRINCIPAL); recorded, and checked once a rule set is applied (gateway policy apply)")
}

// checkPrincipal checks a --principal value: empty, or a principal's name.
func checkPrincipal(p string) error {
	if p != "" && !policy.ValidName(p) {
		return badInput("principal", fmt.Sprintf("--principal must be a principal's name (1 to 64 of a-z, 0-9, '.', '_', '-'), got %q", p))
	}
	return nil
}

func cmdLease(ctx context.Context, a *app, args []string) int {
	if code, done := a.groupHelp("lease", args); done {
		return code
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return a.fail(badInput("command", "usage: gateway lease acquire|renew|release|history [flags]"))
	}
	sub := args[0]
	if sub == "history" {
		return cmdLeaseHistory(ctx, a, args[1:])
	}
	fs, dbURL := a.newFlags("lease " + sub)
	resource := fs.String("resource", "", "resource id")
	holder := fs.String("holder", "", "lease holder id")
	lockTimeout := lockTimeoutFlag(fs, lockTimeoutExit)
	principal := a.principalFlag(fs)
	var ttl time.Duration
	var epoch int64
	// Only acquire grants (renew and release keep the epoch): only it has
	// --failover-epoch-jump.
	jump := new(lease.DefaultFailoverEpochJump)
	switch sub {
	case "acquire":
		fs.DurationVar(&ttl, "ttl", 10*time.Second, "lease time to live")
		jump = failoverJumpFlag(fs)
	case "renew":
		fs.DurationVar(&ttl, "ttl", 10*time.Second, "lease time to live")
		fs.Int64Var(&epoch, "epoch", 0, "the lease's epoch")
	case "release":
		fs.Int64Var(&epoch, "epoch", 0, "the lease's epoch")
	default:
		return a.fail(badInput("command", fmt.Sprintf("unknown lease command %q; want acquire, renew, release or history", sub)))
	}
	if code, ok := a.parseOnlyWithEnv(fs, args[1:], "failover-epoch-jump"); !ok {
		return code
	}
	var epochErr error
	if sub != "acquire" {
		epochErr = checkEpoch(epoch)
	}
	// Check arguments before connecting, so bad input is exit 2 even when the
	// database is down; the first failed check, in this order, is the one
	// reported.
	for _, err := range []error{requireFlag("resource", *resource), requireFlag("holder", *holder), epochErr,
		checkLockTimeout(*lockTimeout), checkFailoverJump(*jump), lease.ValidateResource(*resource), checkPrincipal(*principal)} {
		if err != nil {
			return a.fail(err)
		}
	}
	if sub != "release" && (ttl < lease.MinTTL || ttl > lease.MaxTTL) {
		return a.fail(badInput("ttl", fmt.Sprintf("--ttl must be between %s and %s, got %s", lease.MinTTL, lease.MaxTTL, ttl)))
	}
	pool, err := a.connect(ctx, *dbURL)
	if err != nil {
		return a.fail(err)
	}
	defer pool.Close()
	iss := lease.NewIssuer(pool, lease.WithSchema(a.schema()), lease.WithLockTimeout(*lockTimeout), lease.WithFailoverEpochJump(*jump),
		lease.AsPrincipal(*principal))
	switch sub {
	case "acquire":
		l, err := iss.Acquire(ctx, *resource, *holder, ttl)
		if err != nil {
			a.countRefusal(ctx, pool, err)
			return a.fail(err)
		}
		a.countGrant(ctx, pool, l.Resource, l.Epoch)
		failpoint.Inject(failpoint.AfterLeaseAcquire) // no-op unless built with -tags failpoints
		a.writeJSON(l)
	case "renew":
		l, err := iss.Renew(ctx, *resource, *holder, epoch, ttl)
		if err != nil {
			a.countRefusal(ctx, pool, err)
			return a.fail(err)
		}
		a.writeJSON(l)
	case "release":
		if err := iss.Release(ctx, *resource, *holder, epoch); err != nil {
			a.countRefusal(ctx, pool, err)
			return a.fail(err)
		}
		a.writeJSON(map[string]any{"resource": *resource, "holder": *holder, "epoch": epoch, "released": true})
	}
	return exitOK
}

func cmdEpoch(ctx context.Context, a *app, args []string) int {
	if code, done := a.groupHelp("epoch", args); done {
		return code
	}
	if len(args) == 0 || args[0] != "advance" {
		return a.fail(badInput("command", "usage: gateway epoch advance --resource R --epoch N"))
	}
	fs, dbURL := a.newFlags("epoch advance")
	resource := fs.String("resource", "", "resource id")
	epoch := fs.Int64("epoch", 0, "the externally issued epoch")
	lockTimeout := lockTimeoutFlag(fs, lockTimeoutExit)
	jump := failoverJumpFlag(fs)
	principal := a.principalFlag(fs)
	if code, ok := a.parseOnlyWithEnv(fs, args[1:], "failover-epoch-jump"); !ok {
		return code
	}
	for _, err := range []error{checkResource(*resource), checkEpoch(*epoch), checkLockTimeout(*lockTimeout), checkFailoverJump(*jump), checkPrincipal(*principal)} {
		if err != nil {
			return a.fail(err)
		}
	}
	pool, err := a.connect(ctx, *dbURL)
	if err != nil {
		return a.fail(err)
	}
	defer pool.Close()
	r, err := lease.NewIssuer(pool, lease.WithSchema(a.schema()), lease.WithLockTimeout(*lockTimeout), lease.WithFailoverEpochJump(*jump),
		lease.AsPrincipal(*principal)).Advance(ctx, *resource, *epoch)
	if err != nil {
		a.countRefusal(ctx, pool, err)
		return a.fail(err)
	}
	a.countGrant(ctx, pool, r.Resource, r.Epoch)
	a.writeJSON(map[string]any{"resource": r.Resource, "epoch": r.Epoch})
	return exitOK
}

func cmdEnqueue(ctx context.Context, a *app, args []string) int {
	fs, dbURL := a.newFlags("enqueue")
	var in outbox.Intent
	var fence, payload string
	fs.StringVar(&in.Resource, "resource", "", "resource id")
	fs.Int64Var(&in.Epoch, "epoch", 0, "the worker's fencing epoch")
	fs.StringVar(&in.OperationID, "op", "", "operation id (dedups retries)")
	fs.StringVar(&in.Kind, "kind", "", "intent kind: "+a.kindNames())
	fs.StringVar(&in.IdempotencyKey, "key", "", "business idempotency key (default <resource>/<op>)")
	fs.StringVar(&fence, "fence", "", "fence policy: commit or execute (default per kind)")
	fs.StringVar(&payload, "payload", "", "payload JSON object, or @path to read it from a file")
	principal := a.principalFlag(fs)
	lockTimeout := lockTimeoutFlag(fs, lockTimeoutExit)
	if code, ok := a.parseOnly(fs, args); !ok {
		return code
	}
	if err := checkPrincipal(*principal); err != nil {
		return a.fail(err)
	}
	if err := checkLockTimeout(*lockTimeout); err != nil {
		return a.fail(err)
	}
	in.Fence = outbox.Fence(fence)
	if strings.HasPrefix(payload, "@") {
		b, err := os.ReadFile(payload[1:])
		if err != nil {
			return a.fail(badInput("payload", fmt.Sprintf("read payload file: %v", err)))
		}
		payload = string(b)
	}
	in.Payload = json.RawMessage(payload)
	// Validate before connecting: bad input is exit 2 whatever the database.
	if _, err := outbox.ParseKeyScope(a.getenv("GATEWAY_KEY_SCOPE")); err != nil {
		return a.fail(badInput("key_scope", "$GATEWAY_KEY_SCOPE "+err.Error()))
	}
	// The kinds' rules from the gateway's environment ($GATEWAY_S3_ALLOW,
	// $GATEWAY_WEBHOOK_ALLOW, …): one run would refuse is exit 2, not the
	// kind's default rules.
	cfg, err := a.outboxConfig()
	if err != nil {
		return a.fail(err)
	}
	cfg.Principal = *principal
	cfg.LockTimeout = outboxLockTimeout(*lockTimeout)
	client, err := outbox.New(nil, cfg)
	if err != nil {
		return a.fail(err)
	}
	if _, err := client.Validate(in); err != nil {
		return a.fail(err)
	}
	pool, err := a.connect(ctx, *dbURL)
	if err != nil {
		return a.fail(err)
	}
	defer pool.Close()
	client, _ = outbox.New(pool, cfg)
	res, err := client.Enqueue(ctx, in)
	if err != nil {
		a.countRefusal(ctx, pool, err)
		return a.fail(err)
	}
	failpoint.Inject(failpoint.AfterCommitBeforeAnswer) // no-op unless built with -tags failpoints
	a.writeJSON(res)
	return exitOK
}

// migrationPool is the pool gateway migrate works on: the migration lock is
// a session advisory lock, and the migrations run with a search_path set
// for their session, so behind a pooler in transaction mode they go to
// --database-direct-url, and without one they are refused.
func (a *app) migrationPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	if a.dbDirectURL != nil && *a.dbDirectURL != "" {
		var pooled *pgxpool.Pool
		if dbURL != "" {
			// The direct URL must reach the database --database-url names.
			p, err := a.connectSized(ctx, dbURL, 1)
			if err != nil {
				return nil, err
			}
			defer p.Close()
			pooled = p
		}
		return a.connectDirect(ctx, 0, pooled)
	}
	mode, err := a.queryMode()
	if err != nil {
		return nil, err
	}
	// The URL's default_query_exec_mode wins, as in connectSized.
	if cfg, err := pgx.ParseConfig(dbURL); err == nil && urlSets(dbURL, "default_query_exec_mode") {
		mode = cfg.DefaultQueryExecMode
	}
	if mode != pgx.QueryExecModeCacheStatement {
		return nil, badInput("database_direct_url", "gateway migrate holds a session-level lock and sets its session's search_path, "+
			"which a pooler in transaction mode (--database-query-mode other than cache_statement) cannot carry: give --database-direct-url")
	}
	return a.connect(ctx, dbURL)
}

func cmdStatus(ctx context.Context, a *app, args []string) int {
	fs, dbURL := a.newFlags("status")
	resource := fs.String("resource", "", "resource id (with --op)")
	op := fs.String("op", "", "operation id (with --resource)")
	wait := fs.Duration("wait", 0, "wait up to this long for a final status (woken by PostgreSQL's notification), then print the intent as it is")
	output := outputFlag(fs)
	// The intent id may come before, between or after the flags, as the
	// ids of retry, cancel and resolve.
	pos, code, ok := a.parseInterleaved(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 1 {
		return a.fail(badInput("args", fmt.Sprintf("unexpected argument %q", pos[1])))
	}
	var id string
	if len(pos) == 1 {
		id = pos[0]
	}
	var intentID int64
	switch {
	case id != "" && (*resource != "" || *op != ""):
		return a.fail(badInput("intent_id", "give an intent id or --resource and --op, not both"))
	case id != "":
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil || n < 1 {
			return a.fail(badInput("intent_id", fmt.Sprintf("intent id must be a positive integer, got %q", id)))
		}
		intentID = n
	case *resource == "" || *op == "":
		return a.fail(badInput("intent_id", "usage: gateway status INTENT_ID | gateway status --resource R --op OP"))
	}
	if *wait < 0 {
		return a.fail(badInput("wait", "--wait must not be negative"))
	}
	table, err := a.tableOutput(output)
	if err != nil {
		return a.fail(err)
	}
	pool, err := a.connect(ctx, *dbURL)
	if err != nil {
		return a.fail(err)
	}
	defer pool.Close()
	// gateway status checks no payload: the kinds' rules do not matter.
	ocfg, _ := a.outboxConfig()
	if *wait > 0 {
		// Behind a pooler in transaction mode, Wait LISTENs on
		// --database-direct-url or re-reads every second.
		listen, err := a.listenPool(ctx, pool)
		if err != nil {
			return a.fail(err)
		}
		if listen != nil {
			defer listen.Close()
		}
		ocfg.ListenPool, ocfg.DisableListen = listen, transactionPooled(pool)
	}
	client, err := outbox.New(pool, ocfg)
	if err != nil {
		return a.fail(err)
	}
	var rec *outbox.Record
	if intentID != 0 {
		rec, err = client.Get(ctx, intentID)
	} else {
		rec, err = client.Lookup(ctx, *resource, *op)
	}
	if err != nil {
		return a.fail(err)
	}
	if *wait > 0 && !rec.Status.Terminal() {
		wctx, cancel := context.WithTimeout(ctx, *wait)
		got, err := client.Wait(wctx, rec.IntentID)
		cancel()
		switch {
		case err == nil || errors.Is(err, context.DeadlineExceeded):
			if got != nil {
				rec = got // as it is when the wait ended
			}
		default:
			return a.fail(err)
		}
	}
	// gateway status shows an intent's progress, not its content: the
	// stored record without its payload, and its attempts.
	rec.Payload = nil
	opr, err := operator.New(pool, a.schema())
	if err != nil {
		return a.fail(err)
	}
	attempts, err := opr.Attempts(ctx, rec.IntentID)
	if err != nil {
		return a.fail(err)
	}
	if table {
		writeIntentTable(a.stdout, rec, attempts, time.Now())
		return exitOK
	}
	a.writeJSON(statusView{Record: rec, AttemptHistory: attempts})
	return exitOK
}

// statusView is what gateway status prints: the intent without its
// payload, and one entry per attempt (as GET /api/v1/intents/{id}).
type statusView struct {
	*outbox.Record
	AttemptHistory []operator.Attempt `json:"attempt_history"`
}
