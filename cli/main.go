// Package cli is the gateway command line — migrations, the lease and epoch
// issuer, fenced enqueue and status lookups, and the long-running run, dev and
// bench commands — as a library: cmd/gateway is Main with the built-in kinds,
// and a program with kinds of its own (examples/custom-adapter) is a whole
// gateway binary that enqueues, runs and lists them:
//
//	os.Exit(cli.Main(ctx, os.Args[1:], cli.Options{
//		Adapters: []adapters.Registration{{Kind: "notify", Spec: notifySpec, Executor: notifier}},
//	}))
//
// Every command that writes JSON writes one JSON object on stdout; ls,
// status and lease history write a table instead when stdout is a
// terminal (-o json|table chooses), and --help writes the command's help
// on stdout. Exit codes: 0 ok, 1 internal error or a dependency
// unavailable, 2 bad input (nothing stored) or not found, 3 stale epoch
// (fenced out), 4 lease held by another holder, 5 conflict (an operation
// id or idempotency key reused with other content; an intent whose status
// does not allow an operator's action).
package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/cli/internal/bench"
	"github.com/fencegate/fencegate/internal/buildinfo"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// kindNames lists the kinds this program knows, sorted.
func (a *app) kindNames() string {
	cfg, _ := a.outboxConfig() // the kinds' names, whatever their rules
	return strings.Join(slices.Sorted(maps.Keys(cfg.Kinds)), ", ")
}

// app carries what every command needs; tests build one with buffers.
type app struct {
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	// runHooks is set only for a `gateway run` that gateway bench runs in
	// its own process; nil otherwise.
	runHooks *bench.RunHooks
	// adapters are the program's own (Options.Adapters).
	adapters []adapters.Registration
	// schemaName is the command's --schema (schemaFlag); nil before its
	// flags are made.
	schemaName *string
	// dbQueryMode and dbDirectURL are the command's --database-query-mode
	// and --database-direct-url (newFlags); nil before its flags are made.
	dbQueryMode, dbDirectURL *string
	// dbConfig is the connection of the last pool the command opened
	// (open), for fail to ask how the schema compares with this build
	// (the pool may be closed by then); nil before one is open.
	dbConfig *pgx.ConnConfig
}

type command func(ctx context.Context, a *app, args []string) int

func commands() map[string]command {
	return map[string]command{
		"migrate": cmdMigrate,
		"lease":   cmdLease,
		"epoch":   cmdEpoch,
		"enqueue": cmdEnqueue,
		"status":  cmdStatus,
		"run":     cmdRun,
		"dev":     cmdDev,
		"bench":   cmdBench,
		"probe":   cmdProbe,
		"ls":      cmdLs,
		"policy":  cmdPolicy,
		"token":   cmdToken,
		"retry":   bulkCommand(operator.ActionRetry),
		"cancel":  bulkCommand(operator.ActionCancel),
		"resolve": bulkCommand(operator.ActionResolve),
	}
}

func (a *app) main(ctx context.Context, args []string) int {
	if len(args) >= 1 && (args[0] == "--version" || args[0] == "version") {
		if len(args) > 1 {
			return a.fail(badInput("command", fmt.Sprintf("%s takes no arguments, got %q", args[0], args[1])))
		}
		a.writeJSON(buildinfo.Get())
		return exitOK
	}
	if len(args) == 0 {
		// A usage error: the overview goes where errors go.
		fmt.Fprint(a.stderr, a.usageText())
		return exitBadInput
	}
	if isHelpArg(args[0]) {
		if len(args) > 1 && args[0] == "help" {
			// gateway help COMMAND… is gateway COMMAND… --help.
			return a.main(ctx, append(slices.Clone(args[1:]), "--help"))
		}
		fmt.Fprint(a.stdout, a.usageText())
		return exitOK
	}
	cmd, ok := commands()[args[0]]
	if !ok {
		return a.fail(badInput("command", fmt.Sprintf("unknown command %q; see gateway --help", args[0])))
	}
	return cmd(ctx, a, args[1:])
}

// Options are what a program gives Main beside the arguments. Zero
// fields: os.Stdout, os.Stderr, os.Getenv, the built-in kinds only.
type Options struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// Adapters are the program's own, one registration each (its kind,
	// its payload's rules, its executor): their kinds are accepted beside
	// the built-in ones by enqueue and by run's admin intake, and listed
	// on the pages; `run --adapters` runs those with an executor when it
	// names their kind, as it does the built-in adapters.
	Adapters []adapters.Registration
}

// Main runs one command line (without the program name) and returns its
// exit code. ctx ending (SIGTERM) stops run and dev.
func Main(ctx context.Context, args []string, opts Options) int {
	a := &app{stdout: opts.Stdout, stderr: opts.Stderr, getenv: opts.Getenv, adapters: opts.Adapters}
	if a.stdout == nil {
		a.stdout = os.Stdout
	}
	if a.stderr == nil {
		a.stderr = os.Stderr
	}
	if a.getenv == nil {
		a.getenv = os.Getenv
	}
	return a.main(ctx, args)
}

// outboxConfig is the outbox configuration of the CLI's commands: the
// built-in kinds, with the rules the environment gives them as it gives
// `gateway run` its flags (builtinAdapter.enqueueSpec), and the program's
// own (Options.Adapters). The error is the first variable of those rules
// that run would refuse (bad input naming its flag's field); the
// configuration then has that kind's default rules, good only for a
// command that checks no payload (gateway status, the help's kind list):
// gateway enqueue refuses it before connecting.
func (a *app) outboxConfig() (outbox.Config, error) {
	kinds := outbox.DefaultKinds()
	var first error
	for _, b := range builtinAdapters {
		if b.enqueueSpec == nil {
			continue
		}
		spec, ok, err := b.enqueueSpec(a.getenv)
		if err != nil && first == nil {
			first = err
		}
		if ok {
			kinds[b.kind] = spec
		}
	}
	for _, r := range a.adapters {
		kinds[r.Kind] = r.Spec
	}
	// The gateway's key scope ($GATEWAY_KEY_SCOPE, as --key-scope of run),
	// so that gateway enqueue stores the key the intake would.
	// A value outside global|resource makes outbox.New fail; gateway
	// enqueue checks it first (exit 2 naming key_scope).
	return outbox.Config{Schema: a.schema(), Kinds: kinds, KeyScope: outbox.KeyScope(a.getenv("GATEWAY_KEY_SCOPE"))}, first
}

// envError is err, an error of a flag's value that came from the flag's
// variable env (bad input naming the flag's field), with a message that
// says the variable.
func envError(env string, err error) error {
	ce := classify(err)
	if ce.Code != errmap.InvalidInput {
		return err
	}
	return badInput(ce.Field, "$"+env+": "+ce.Message)
}

// fieldOf is the field err names, if it is bad input.
func fieldOf(err error) string { return classify(err).Field }
