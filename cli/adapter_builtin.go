package cli

import (
	"context"
	"errors"
	"flag"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/outbox"
)

// builtinAdapters are the adapters `gateway run --adapters` accepts beside
// a program's own (Options.Adapters), in the order its messages list them.
// Each is defined, with its flags, in a file of its own (adapter_email.go,
// adapter_file.go, …): a new built-in adapter is its package, that file
// and one line here.
var builtinAdapters = []builtinAdapter{emailAdapter, fileAdapter, webhookAdapter, s3Adapter}

// builtinAdapter is one built-in adapter of gateway run.
type builtinAdapter struct {
	kind string
	// flags defines the adapter's flags on run's flag set and returns what
	// reads them once it is parsed.
	flags func(fs *flag.FlagSet) adapterFlags
	// enqueueSpec, when set, is the kind's intake rules for gateway
	// enqueue, from the environment `gateway run` reads its flags from
	// (ok false: none set, the kind's default rules). A variable set to
	// what run would refuse is an error, bad input naming its flag's field
	// (envError): the default rules in its place would fail open.
	enqueueSpec func(getenv func(string) string) (spec outbox.KindSpec, ok bool, err error)
}

// adapterFlags are one built-in adapter's flags, parsed.
type adapterFlags interface {
	// check checks the flags, connecting to nothing and creating nothing
	// (it may read a file a flag names); runs says whether the adapter
	// runs (what only a running adapter needs is required only then).
	// Errors are bad input naming the flag's field.
	check(env adapterEnv, runs bool) error
	// registration makes the adapter, once every flag is checked and the
	// database is reachable: making one may create things (the file
	// adapter its root), which a bad flag elsewhere must not leave behind.
	registration(ctx context.Context, env adapterEnv) (adapters.Registration, error)
}

// lastChecker is implemented by adapter flags with a rule checked after
// every other flag: a flag that an adapter run by default requires (the
// email adapter's --mail-from-allow) must not hide a bad flag given.
type lastChecker interface {
	checkLast(env adapterEnv, runs bool) error
}

// intakeRuler is implemented by adapter flags that give intake rules
// without the adapter (an allow-list, a policy): gateway run applies them
// to the intake of a process that does not run the adapter, when any of
// those flags is given (set reports a flag given on the command line or in
// the environment), so that a relay serving the intake with the
// deployment's shared settings refuses what the adapter's process would,
// naming the field, instead of storing an intent that fails at execute.
// ok false: none given, the kind's own rules.
type intakeRuler interface {
	intake(set func(flag string) bool) (spec outbox.KindSpec, ok bool, err error)
}

// optIn is implemented by adapter flags that run their adapter when
// --adapters is not given (the webhook adapter's --webhook-allow).
type optIn interface {
	optedIn() bool
}

// adapterEnv is what gateway run gives every adapter it makes.
type adapterEnv struct {
	log *slog.Logger
	// registry is the gateway's, for the adapters' own metrics.
	registry prometheus.Registerer
	// unknown is --unknown-outcome.
	unknown executor.UnknownPolicy
}

// standIn stands in for a built-in adapter of kind until it is made, so
// that the gateway's configuration is checked and its pool sized before
// anything is connected (registration says why it waits).
func standIn(kind string) adapters.Registration {
	return adapters.Registration{Kind: kind, Spec: outbox.KindSpec{DefaultFence: outbox.FenceCommit}, Executor: pendingExecutor(kind)}
}

// pendingExecutor is a stand-in's executor; it never runs.
type pendingExecutor string

func (k pendingExecutor) Kind() string                      { return string(k) }
func (pendingExecutor) Capabilities() adapters.Capabilities { return adapters.Capabilities{} }
func (pendingExecutor) Execute(context.Context, adapters.Request) (adapters.Outcome, error) {
	return adapters.Outcome{}, adapters.PermanentError(errors.New("cli: a stand-in adapter ran"))
}
