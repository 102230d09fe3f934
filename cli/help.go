package cli

import (
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
)

// cmdDoc is what the help says of a command beside its flags: one line
// on what it does, its command lines, and examples to copy.
type cmdDoc struct {
	name    string // as typed after "gateway"
	summary string
	usage   []string
	example []string
}

// commandDocs are the commands in the order `gateway --help` lists them.
// A command's --help (and `gateway help COMMAND`) prints its entry and its
// flags; a group (lease, epoch, policy, token) lists its commands.
var commandDocs = []cmdDoc{
	{"migrate", "create or upgrade fencegate's tables and functions in --schema",
		[]string{"gateway migrate [--namespace NS] [--move-from public] [--allow-unsafe-schema]"},
		[]string{"gateway migrate --database-url postgres://gateway@db.internal/app"}},
	{"lease acquire", "take a resource's lease: a new, higher epoch every time (the fencing token)",
		[]string{"gateway lease acquire --resource R --holder H [--ttl 10s]"},
		[]string{"gateway lease acquire --resource reports/2024 --holder worker-1 --ttl 30s"}},
	{"lease renew", "extend a lease you hold, keeping its epoch",
		[]string{"gateway lease renew --resource R --holder H --epoch N [--ttl 10s]"},
		[]string{"gateway lease renew --resource reports/2024 --holder worker-1 --epoch 7 --ttl 30s"}},
	{"lease release", "give a lease up, so that the next holder need not wait for it to expire",
		[]string{"gateway lease release --resource R --holder H --epoch N"},
		[]string{"gateway lease release --resource reports/2024 --holder worker-1 --epoch 7"}},
	{"lease history", "a resource's epochs, newest first: who got each and how (a table on a terminal)",
		[]string{"gateway lease history --resource R [--limit N] [-o json|table]"},
		[]string{"gateway lease history --resource reports/2024 --limit 10"}},
	{"epoch advance", "register an epoch issued by a lock service outside (etcd, ZooKeeper, Consul)",
		[]string{"gateway epoch advance --resource R --epoch N"},
		[]string{"gateway epoch advance --resource reports/2024 --epoch 1042"}},
	{"enqueue", "commit an intent under a fencing epoch (refused, exit 3, once the epoch is stale)",
		[]string{"gateway enqueue --resource R --epoch N --op OP --kind KIND [--key K] [--fence commit|execute] --payload JSON|@path"},
		[]string{"gateway enqueue --resource reports/2024 --epoch 7 --op send-1 --kind email --payload @mail.json"}},
	{"status", "an intent's progress: status, effect, attempts, last error (a table on a terminal)",
		[]string{"gateway status INTENT_ID [--wait 30s] [-o json|table]", "gateway status --resource R --op OP [--wait 30s] [-o json|table]"},
		[]string{"gateway status 42 --wait 30s"}},
	{"ls", "list intents, newest first (a table on a terminal, JSON when piped)",
		[]string{"gateway ls [--status S] [--resource R] [--kind K] [--limit N] [--cursor C] [-o json|table]"},
		[]string{"gateway ls --status failed --kind webhook"}},
	{"retry", "relay failed or unknown intents again: by id, or every intent a filter selects",
		[]string{"gateway retry ID… [--force] [--note N]",
			"gateway retry --status failed|unknown [--kind K] [--resource R] [--resource-prefix P] [--since 2h] [--until T] [--force] [--note N] [--yes]"},
		[]string{`gateway retry 42 43 --note "the receiver is back"`,
			"gateway retry --status failed --kind webhook --since 2h    # a dry run: lists the first ids; --yes does it"}},
	{"cancel", "give up pending, failed or unknown intents: by id, or every intent a filter selects",
		[]string{"gateway cancel ID… [--note N]",
			"gateway cancel --status pending|failed|unknown [--kind K] [--resource R] [--resource-prefix P] [--since 2h] [--until T] [--note N] [--yes]"},
		[]string{`gateway cancel 42 --note "sent by hand"`}},
	{"resolve", "record what you found at the destination of unknown intents: succeeded or failed",
		[]string{"gateway resolve ID… --outcome succeeded|failed [--note N]",
			"gateway resolve --status unknown --outcome succeeded|failed [--kind K] [--resource R] [--resource-prefix P] [--since 2h] [--until T] [--note N] [--yes]"},
		[]string{`gateway resolve 42 --outcome succeeded --note "the mail is in the mailbox"`}},
	{"policy apply", "apply the rule set (principals, destinations) from a JSON or YAML file (- : stdin)",
		[]string{"gateway policy apply FILE|-"},
		[]string{"gateway policy apply policy.yaml"}},
	{"policy show", "the rule set in force, with its version",
		[]string{"gateway policy show"},
		[]string{"gateway policy show"}},
	{"policy init", "a rule set saying what today's flags and tokens say, to review and apply",
		[]string{"gateway policy init --from-flags [--tokens-file FILE]"},
		[]string{"gateway policy init --from-flags > policy.json"}},
	{"token new", "a new random admin API token (256 bits); with --name and --role, its tokens-file line",
		[]string{"gateway token new [--name N --role worker|operator]"},
		[]string{"gateway token new --name ops --role operator"}},
	{"run", "the relay and the adapters, until SIGTERM or SIGINT (every flag also as GATEWAY_<FLAG>)",
		[]string{"gateway run [flags]"},
		[]string{"gateway run --adapters email,webhook --webhook-allow hooks.example.com --metrics-addr 127.0.0.1:9090"}},
	{"dev", "the whole system in one process, for a laptop: PostgreSQL, NATS, an SMTP sink, the pages",
		[]string{"gateway dev [--demo] [flags]"},
		[]string{"gateway dev --demo"}},
	{"bench", "measure the gateway: enqueue, relay and drain throughput and latency",
		[]string{"gateway bench [--case NAMES] [--duration D] [--drain-intents N] [--file-dir DIR] [--json]"},
		[]string{"gateway bench --case e2e-drain --drain-intents 100000"}},
	{"probe", "GET a URL: exit 0 on 2xx, else 1 (healthchecks in an image without curl)",
		[]string{"gateway probe URL [--timeout 5s] [--tls-ca FILE]"},
		[]string{"gateway probe http://127.0.0.1:9090/healthz"}},
}

// groupDocs are the commands made of subcommands.
var groupDocs = map[string]string{
	"lease":  "a resource's lease and its epochs",
	"epoch":  "epochs issued outside the gateway",
	"policy": "the rule set: who may do what, where",
	"token":  "admin API tokens",
}

// docOf returns the help entry of a command ("lease acquire").
func docOf(name string) (cmdDoc, bool) {
	for _, d := range commandDocs {
		if d.name == name {
			return d, true
		}
	}
	return cmdDoc{}, false
}

// isHelpArg reports whether arg asks for help.
func isHelpArg(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// usageText is the overview `gateway --help` prints: every command with
// its one line, and the kinds this program knows (the built-in ones and
// Options.Adapters', from the one registry).
func (a *app) usageText() string {
	var b strings.Builder
	b.WriteString(`gateway — fenced side effects, once, only while authority is held

Usage: gateway COMMAND [flags]
       gateway help COMMAND       (or gateway COMMAND --help: its flags and an example)

Commands:
`)
	width := 0
	for _, d := range commandDocs {
		width = max(width, len(d.name))
	}
	for _, d := range commandDocs {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, d.name, d.summary)
	}
	fmt.Fprintf(&b, "  %-*s  %s\n", width, "--version", `{"version","commit","go"}`)
	b.WriteString(`
Every command takes --database-url (default $GATEWAY_DATABASE_URL) and
--schema (default $GATEWAY_SCHEMA, else fencegate); behind PgBouncer in
transaction mode, --database-query-mode exec and --database-direct-url
(docs/operations.md, "PgBouncer in transaction mode"). Every flag of run and
dev can also be set as GATEWAY_<FLAG> (--db-max-conns:
GATEWAY_DB_MAX_CONNS); the command line wins.
ls, status and lease history print a table on a terminal and JSON
otherwise (-o json|table chooses); every other command prints one JSON
object.

Exit codes: 0 ok, 1 internal/unavailable, 2 bad input or not found,
3 stale epoch, 4 lease held, 5 conflict (an operation id reused, or an
intent whose status does not allow the action).
`)
	b.WriteString("Kinds: " + a.kindNames() + "\n")
	return b.String()
}

// printCommandHelp writes a command's help on stdout: its line, usage and
// example from commandDocs, then its flags.
func (a *app) printCommandHelp(fs *flag.FlagSet) {
	name := strings.TrimPrefix(fs.Name(), "gateway ")
	w := a.stdout
	if d, ok := docOf(name); ok {
		fmt.Fprintf(w, "gateway %s: %s\n\nUsage:\n", name, d.summary)
		for _, u := range d.usage {
			fmt.Fprintf(w, "  %s\n", u)
		}
		fmt.Fprintf(w, "\nExample:\n")
		for _, e := range d.example {
			fmt.Fprintf(w, "  %s\n", e)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "gateway %s\n\n", name)
	}
	fmt.Fprintln(w, "Flags:")
	printFlags(w, fs)
}

// groupHelp answers `gateway GROUP --help` (and `gateway help GROUP`):
// the group's commands with their lines, on stdout, exit 0. done is false
// when args do not ask for help.
func (a *app) groupHelp(group string, args []string) (code int, done bool) {
	if len(args) == 0 || !isHelpArg(args[0]) {
		return 0, false
	}
	fmt.Fprintf(a.stdout, "gateway %s: %s\n\nCommands:\n", group, groupDocs[group])
	for _, d := range commandDocs {
		if strings.HasPrefix(d.name, group+" ") {
			fmt.Fprintf(a.stdout, "  gateway %-16s %s\n", d.name, d.summary)
		}
	}
	fmt.Fprintf(a.stdout, "\nRun \"gateway %s COMMAND --help\" for a command's flags and an example.\n", group)
	return exitOK, true
}

// printFlags writes fs's flags, one entry each, like flag.PrintDefaults
// with two differences: a flag is written --name (-o for a one-letter
// one), and a default is written only when the flag's own text does not
// already say it. flag.PrintDefaults appends "(default …)" to every flag
// whose default is not its type's zero value, and most of the gateway's
// flags say their default themselves, often with where it comes from
// ("(default $GATEWAY_DATABASE_URL)"): it was written twice.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		dash := "--"
		if len(f.Name) == 1 {
			dash = "-"
		}
		head := "  " + dash + f.Name
		if typ != "" {
			head += " " + typ
		}
		if !saysDefault.MatchString(usage) && !zeroDefault(f.DefValue) {
			def := f.DefValue
			if typ == "string" {
				def = fmt.Sprintf("%q", def)
			}
			usage += " (default " + def + ")"
		}
		fmt.Fprintln(w, head)
		for _, line := range wrap(usage, 72) {
			fmt.Fprintf(w, "      %s\n", line)
		}
	})
}

// saysDefault matches a flag's text that says its default: "(default
// $GATEWAY_SCHEMA, else fencegate)", "default: off", "; default
// email,file".
var saysDefault = regexp.MustCompile(`\bdefault[ :]`)

// zeroDefault reports whether a flag's default is its type's zero value,
// which goes without saying.
func zeroDefault(v string) bool {
	switch v {
	case "", "0", "false", "0s":
		return true
	}
	return false
}

// wrap splits s into lines of at most width bytes, between words (a
// longer word stays whole).
func wrap(s string, width int) []string {
	var lines []string
	var cur strings.Builder
	for _, word := range strings.Fields(s) {
		if cur.Len() > 0 && cur.Len()+1+len(word) > width {
			lines = append(lines, cur.String())
			cur.Reset()
		}
		if cur.Len() > 0 {
			cur.WriteByte(' ')
		}
		cur.WriteString(word)
	}
	if cur.Len() > 0 || len(lines) == 0 {
		lines = append(lines, cur.String())
	}
	return lines
}

// flagSyntax matches the flag package's errors about a value:
// `invalid value "10" for flag -ttl: parse error`, `invalid boolean value
// "x" for -yes: parse error`.
var flagSyntax = regexp.MustCompile(`^invalid (?:boolean )?value ("(?:[^"\\]|\\.)*") for (?:flag )?-([^\s:]+): (.*)$`)

// flagParseError rewrites an error of fs.Parse for a person: flags written
// --name, as the documentation writes them, and a value of the wrong form
// answered with an example of the right one (`invalid value "10" for
// flag --ttl: a duration such as 10s, 1m30s`).
func flagParseError(fs *flag.FlagSet, err error) (field, msg string) {
	msg = err.Error()
	if m := flagSyntax.FindStringSubmatch(msg); m != nil {
		reason := m[3]
		if f := fs.Lookup(m[2]); f != nil && reason == "parse error" {
			if hint := valueHint(f); hint != "" {
				reason = hint
			}
		}
		return flagValueField(m[2]), fmt.Sprintf("invalid value %s for flag %s: %s", m[1], dashed(m[2]), reason)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return flagValueField(name), fmt.Sprintf("flag %s needs a value", dashed(name))
	}
	// No flag of the command to name: the command line is what is wrong.
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "flags", fmt.Sprintf("unknown flag %s (see gateway %s --help)", dashed(name), strings.TrimPrefix(fs.Name(), "gateway "))
	}
	return "flags", msg
}

// flagValueField is the field a flag's bad value is named by: the flag's name
// with underscores (--execute-timeout: execute_timeout), as the same bad
// value from its environment variable is.
func flagValueField(name string) string {
	name = strings.TrimLeft(name, "-")
	if long, ok := shortFlags[name]; ok {
		return long
	}
	return strings.ReplaceAll(name, "-", "_")
}

// shortFlags are the fields of the one-letter flags, as their own checks
// name them (-o's bad value names output).
var shortFlags = map[string]string{"o": "output"}

// dashed writes a flag's name as the help does: --name, or -o.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// valueHint is an example of a valid value of f, by its type; "" for a
// flag of another type.
func valueHint(f *flag.Flag) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case time.Duration:
		return "a duration such as 10s, 1m30s"
	case int, int64, uint, uint64:
		return "a whole number such as 5"
	case float64:
		return "a number such as 0.5"
	case bool:
		return "true or false"
	}
	return ""
}
