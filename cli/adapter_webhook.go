package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/kinds/webhookkind"
	"github.com/fencegate/fencegate/outbox"
)

// webhookAdapter is the webhook adapter (adapters/webhook): signed HTTP
// requests to the destinations of an allow-list the intake enforces too.
var webhookAdapter = builtinAdapter{kind: webhook.Kind, flags: newWebhookFlags, enqueueSpec: webhookEnqueueSpec}

type webhookFlags struct {
	allow, secret, dedups *string
	headerSecrets         *headerSecretsFlag
	perHost               *int
	// headerValues are the header secrets' values, read by check.
	headerValues map[string]string
}

func newWebhookFlags(fs *flag.FlagSet) adapterFlags {
	f := &webhookFlags{
		allow:         fs.String("webhook-allow", "", "destinations the webhook adapter may call, host or host:port, comma-separated (required to run it); a listed name resolving to a loopback/private/link-local address is refused unless that address is listed too"),
		secret:        fs.String("webhook-secret", "", "Standard Webhooks signing secrets, whsec_<base64>, comma-separated for rotation (every request signed by each); default $GATEWAY_WEBHOOK_SECRET, none: unsigned"),
		dedups:        fs.String("webhook-dedups-on-key", "", "webhook destinations (host or host:port, comma-separated) that drop a second request with the same Idempotency-Key: a lost answer from them is resent with the same key"),
		headerSecrets: &headerSecretsFlag{},
		perHost:       fs.Int("webhook-max-concurrency-per-host", webhook.DefaultMaxConcurrencyPerHost, "webhook requests in flight to one host:port at most"),
	}
	fs.Var(f.headerSecrets, "webhook-header-secret", `header secrets, NAME=FILE, comma-separated or the flag repeated: a payload header {"secret": "NAME"} is sent with FILE's content (read at start, a final newline trimmed; never printed)`)
	return f
}

// optedIn: the allow-list is the opt-in, when --adapters is not given.
func (f *webhookFlags) optedIn() bool { return *f.allow != "" }

func (f *webhookFlags) config(env adapterEnv) webhook.Config {
	return webhook.Config{
		Allow:                 webhook.SplitList(*f.allow),
		Secrets:               webhook.SplitList(*f.secret),
		DedupsOnKey:           webhook.SplitList(*f.dedups),
		HeaderSecrets:         f.headerValues,
		MaxConcurrencyPerHost: given(*f.perHost),
		LookupSettle:          0, // the runtime's --lookup-settle
		Logger:                env.log,
	}
}

// webhookFields maps webhook.Config's fields to the flags that set them.
var webhookFields = fieldFlags{
	{path: "Allow", flag: "webhook-allow"},
	{path: "DedupsOnKey", flag: "webhook-dedups-on-key"},
	{path: "Secrets", flag: "webhook-secret"},
	{path: "HeaderSecrets", flag: "webhook-header-secret"},
	{path: "MaxConcurrencyPerHost", flag: "webhook-max-concurrency-per-host"},
}

func (f *webhookFlags) check(env adapterEnv, runs bool) error {
	if err := f.headerSecrets.check(); err != nil {
		return err
	}
	if runs {
		values, err := f.headerSecrets.read()
		if err != nil {
			return err
		}
		f.headerValues = values
	}
	cfg := f.config(env)
	if !runs && len(cfg.Allow) == 0 {
		// Only a running adapter needs an allow-list (and its secrets'
		// files read): a stand-in keeps the other flags checked.
		cfg.Allow = []string{"localhost"}
	}
	return webhookFields.flagError(cfg.Validate())
}

func (f *webhookFlags) registration(_ context.Context, env adapterEnv) (adapters.Registration, error) {
	w, err := webhook.New(f.config(env))
	if err != nil {
		return adapters.Registration{}, webhookFields.flagError(err)
	}
	return w.Registration(), nil
}

// intake: the allow-list and the header secrets' names, when given.
func (f *webhookFlags) intake(set func(string) bool) (outbox.KindSpec, bool, error) {
	if !set("webhook-allow") && !set("webhook-header-secret") {
		return outbox.KindSpec{}, false, nil
	}
	in, err := webhook.NewIntake(webhook.SplitList(*f.allow), f.headerSecrets.names())
	if err != nil {
		return outbox.KindSpec{}, false, webhookFields.flagError(err)
	}
	return in.KindSpec(), true, nil
}

// webhookEnqueueSpec: where the allow-list or the header secrets are
// known to gateway enqueue too ($GATEWAY_WEBHOOK_ALLOW,
// $GATEWAY_WEBHOOK_HEADER_SECRET, as the gateway's), enqueue refuses a URL
// to a host not on the list, and a header naming a secret not given. Only
// the secrets' names are used: their files are not read. A variable that
// gateway run would refuse is bad input naming its flag's field
// (webhook_allow, webhook_header_secret): never the kind's default rules
// in its place, which would let any destination through.
func webhookEnqueueSpec(getenv func(string) string) (outbox.KindSpec, bool, error) {
	allow, secrets := getenv("GATEWAY_WEBHOOK_ALLOW"), getenv("GATEWAY_WEBHOOK_HEADER_SECRET")
	if allow == "" && secrets == "" {
		return outbox.KindSpec{}, false, nil
	}
	var names []string // nil: not known, not checked
	if secrets != "" {
		var f headerSecretsFlag
		_ = f.Set(secrets) // takes any text; check judges it
		if err := f.check(); err != nil {
			return outbox.KindSpec{}, false, envError("GATEWAY_WEBHOOK_HEADER_SECRET", err)
		}
		names = f.names()
	}
	in, err := webhook.NewIntake(webhook.SplitList(allow), names)
	if err != nil {
		env := "GATEWAY_WEBHOOK_ALLOW"
		if fieldOf(webhookFields.flagError(err)) == "webhook_header_secret" {
			env = "GATEWAY_WEBHOOK_HEADER_SECRET"
		}
		return outbox.KindSpec{}, false, envError(env, webhookFields.flagError(err))
	}
	return in.KindSpec(), true, nil
}

// maxHeaderSecret is the largest header secret file read, in bytes.
const maxHeaderSecret = 16 << 10

// headerSecretsFlag is --webhook-header-secret: NAME=FILE entries, given
// comma-separated or by repeating the flag. It prints as the names only
// (--print-config, --help): never a value, nor where it is kept. Set takes
// any text; check says what is wrong with it, naming
// webhook_header_secret, whether it came from the command line or the
// environment.
type headerSecretsFlag struct {
	items []string
}

type headerSecretEntry struct{ name, file string }

// Set adds the comma-separated items of v.
func (f *headerSecretsFlag) Set(v string) error {
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			f.items = append(f.items, item)
		}
	}
	return nil
}

// String is the secrets' names, comma-separated.
func (f *headerSecretsFlag) String() string {
	if f == nil {
		return ""
	}
	return strings.Join(f.names(), ",")
}

// names are the entries' names; an entry that is not NAME=FILE is
// "(invalid)" (it may be a value given by mistake).
func (f *headerSecretsFlag) names() []string {
	names := make([]string, len(f.items))
	for i, item := range f.items {
		name, _, ok := strings.Cut(item, "=")
		if !ok {
			name = "(invalid)"
		}
		names[i] = name
	}
	return names
}

// entries parses the items: each NAME=FILE, the name valid and given once.
func (f *headerSecretsFlag) entries() ([]headerSecretEntry, error) {
	var out []headerSecretEntry
	for _, item := range f.items {
		name, file, ok := strings.Cut(item, "=")
		if !ok || name == "" || file == "" {
			// Not echoed: a value given by mistake in place of a file
			// must not be printed.
			return nil, badInput("webhook_header_secret", fmt.Sprintf("--webhook-header-secret entries are NAME=FILE: entry %d is not", len(out)+1))
		}
		if err := webhookkind.CheckSecretName("HeaderSecrets", name); err != nil {
			return nil, webhookFields.flagError(err)
		}
		if slices.ContainsFunc(out, func(o headerSecretEntry) bool { return o.name == name }) {
			return nil, badInput("webhook_header_secret", fmt.Sprintf("--webhook-header-secret names secret %q twice", name))
		}
		out = append(out, headerSecretEntry{name: name, file: file})
	}
	return out, nil
}

// secretFiles are the --webhook-header-secret files (entries that do not
// parse are left to check, which names them).
func (f *webhookFlags) secretFiles() []secretFile {
	entries, _ := f.headerSecrets.entries()
	var out []secretFile
	for _, e := range entries {
		out = append(out, secretFile{path: e.file, field: "webhook_header_secret"})
	}
	return out
}

// check checks the entries without reading the files.
func (f *headerSecretsFlag) check() error {
	_, err := f.entries()
	return err
}

// read reads each secret's file: its content, without one final newline
// (CRLF or LF), is the value. Errors name the secret and the file, never
// what the file holds.
func (f *headerSecretsFlag) read() (map[string]string, error) {
	entries, err := f.entries()
	if err != nil {
		return nil, err
	}
	values := make(map[string]string, len(entries))
	for _, e := range entries {
		b, err := readSmall(e.file, maxHeaderSecret)
		if err != nil {
			return nil, badInput("webhook_header_secret", fmt.Sprintf("--webhook-header-secret %s: %v", e.name, err))
		}
		v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		values[e.name] = v
	}
	return values, nil
}

// readSmall reads the file at path, refusing one over limit bytes.
func readSmall(path string, limit int64) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is over %d bytes: a header value is not that large", path, limit)
	}
	return b, nil
}
