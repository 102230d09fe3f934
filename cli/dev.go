package cli

import (
	"context"
	"flag"
	"io"

	"github.com/fencegate/fencegate/cli/internal/devenv"
)

// cmdDev runs the whole system in one process (gateway dev), like
// `temporal server start-dev`: a throwaway PostgreSQL (or --database-url),
// an embedded NATS JetStream server (or --nats-url), an SMTP sink with
// result lookup (or Mailpit), a file root, the dispatcher, both adapters and
// the admin server, until SIGINT/SIGTERM. It prints the URLs on stderr and
// one JSON object (devenv.Ready) on stdout once ready. --demo then replays the
// article's scenario in-process. On a signal everything stops in reverse
// order: nothing keeps running and the temporary data directory is removed.
//
// Flags: --addr (admin, default 127.0.0.1:8080); --data-dir (keep the
// PostgreSQL cluster and NATS store there and reuse them next time;
// default: a temporary directory removed on exit); --database-url and
// --nats-url use existing servers instead (the environment's
// GATEWAY_DATABASE_URL and GATEWAY_NATS_URL are deliberately ignored, so
// dev never touches a configured server by accident); --nats-port (embedded
// NATS port, default free); --smtp-addr (the sink's listen address, default
// a free port; with --mailpit-url, Mailpit's SMTP address, default
// 127.0.0.1:1025); --mailpit-url (send mail to Mailpit and look results up
// there); --file-root (default ./var/files); --demo; --log-level.
//
// The environment itself and the demo are cli/internal/devenv's; this parses
// the flags into devenv.Options and runs it.
func cmdDev(ctx context.Context, a *app, args []string) int {
	fs := flag.NewFlagSet("gateway dev", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o devenv.Options
	fs.StringVar(&o.Addr, "addr", devenv.DefaultAddr, "admin server address (loopback)")
	fs.StringVar(&o.DataDir, "data-dir", "", "keep PostgreSQL's cluster and the NATS store here and reuse them (default: a temporary directory removed on exit)")
	fs.StringVar(&o.DatabaseURL, "database-url", "", "use this PostgreSQL instead of starting one ($GATEWAY_DATABASE_URL is ignored)")
	fs.StringVar(&o.NATSURL, "nats-url", "", "use this NATS server instead of starting one ($GATEWAY_NATS_URL is ignored)")
	fs.IntVar(&o.NATSPort, "nats-port", 0, "port of the embedded NATS server on 127.0.0.1 (default: a free port)")
	fs.StringVar(&o.SMTPAddr, "smtp-addr", "", "SMTP sink listen address (default 127.0.0.1 and a free port); with --mailpit-url, Mailpit's SMTP address (default 127.0.0.1:1025)")
	fs.StringVar(&o.MailpitURL, "mailpit-url", "", "send mail to Mailpit and look results up through its API, e.g. http://127.0.0.1:8025 (default: the built-in sink)")
	fs.StringVar(&o.FileRoot, "file-root", devenv.DefaultFileRoot, "directory the file adapter publishes under")
	fs.BoolVar(&o.Demo, "demo", false, "replay the article's scenario: worker A pauses past its lease, B takes over, A's late write is fenced out")
	newLogger := a.logFlags(fs)
	allowFsyncOff := a.fsyncFlag(fs)
	a.schemaFlag(fs)
	if code, ok := a.parseWithEnv(fs, args, "database-url", "nats-url"); !ok {
		return code
	}
	o.Schema = a.schema()
	o.AllowFsyncOff = *allowFsyncOff
	if err := noArgs(fs); err != nil {
		return a.fail(err)
	}
	if err := o.Validate(); err != nil {
		return a.fail(err)
	}
	logger, err := newLogger()
	if err != nil {
		return a.fail(err)
	}

	o.Stdout, o.Stderr, o.Logger = a.stdout, a.stderr, logger
	o.Connect, o.RequireFsync, o.RedactURL = a.connect, a.requireFsync, redactURL
	o.StopTimeout = stopTimeout
	code, err := devenv.Run(ctx, o)
	if err != nil {
		return a.fail(flagError(err))
	}
	return code
}
