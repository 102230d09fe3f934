package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/policy"
)

// cmdPolicy is `gateway policy apply FILE` and `gateway policy show`: the
// rule set kept in the database (package policy, docs/policy.md).
func cmdPolicy(ctx context.Context, a *app, args []string) int {
	if code, done := a.groupHelp("policy", args); done {
		return code
	}
	if len(args) == 0 || (args[0] != "apply" && args[0] != "show" && args[0] != "init") {
		return a.fail(badInput("command", "usage: gateway policy apply FILE|- , gateway policy show, gateway policy init --from-flags"))
	}
	sub := args[0]
	if sub == "init" {
		return cmdPolicyInit(a, args[1:])
	}
	fs, dbURL := a.newFlags("policy " + sub)
	if code, ok := a.parse(fs, args[1:]); !ok {
		return code
	}
	var doc policy.Document
	if sub == "apply" {
		if fs.NArg() != 1 {
			return a.fail(badInput("file", "usage: gateway policy apply FILE (a JSON or YAML policy document; - reads standard input)"))
		}
		b, err := readPolicyFile(fs.Arg(0))
		if err != nil {
			return a.fail(badInput("file", err.Error()))
		}
		// Checked before connecting: a bad document is exit 2 naming
		// the field, with the database untouched.
		if doc, err = policy.Parse(b); err != nil {
			return a.fail(err)
		}
	} else if err := noArgs(fs); err != nil {
		return a.fail(err)
	}
	pool, err := a.connect(ctx, *dbURL)
	if err != nil {
		return a.fail(err)
	}
	defer pool.Close()
	if sub == "apply" {
		version, err := policy.Apply(ctx, pool, a.schema(), doc)
		if err != nil {
			return a.fail(err)
		}
		a.writeJSON(map[string]any{"version": version, "principals": len(doc.Principals)})
		return exitOK
	}
	cur, ok, err := policy.Current(ctx, pool, a.schema())
	if err != nil {
		return a.fail(err)
	}
	if !ok {
		a.writeJSON(map[string]any{"version": 0, "document": nil})
		return exitOK
	}
	a.writeJSON(cur)
	return exitOK
}

// readPolicyFile reads FILE, or standard input for "-", at most 1 MiB.
func readPolicyFile(name string) ([]byte, error) {
	var r io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, 1<<20+1))
	if err != nil {
		return nil, err
	}
	if len(b) > 1<<20 {
		return nil, fmt.Errorf("%s: over 1 MiB", name)
	}
	return b, nil
}

// cmdPolicyInit is `gateway policy init --from-flags`: the rule set that
// says what today's flags and tokens say, read from the environment gateway
// run reads (--tokens-file or $GATEWAY_TOKENS_FILE, else $GATEWAY_TOKENS; $GATEWAY_KEY_SCOPE,
// $GATEWAY_MAIL_FROM_ALLOW, $GATEWAY_MAIL_RCPT_ALLOW,
// $GATEWAY_WEBHOOK_ALLOW, $GATEWAY_FILE_ALLOW, $GATEWAY_S3_BUCKET,
// $GATEWAY_S3_ALLOW), printed as a document to review, keep in git and
// apply. Each token becomes a principal of its name, role and scope
// (resources and kinds "*" where the token had none); no secret is
// printed. It connects to nothing.
func cmdPolicyInit(a *app, args []string) int {
	fs, _ := a.newFlags("policy init")
	fromFlags := fs.Bool("from-flags", false, "derive the document from the gateway's flags and tokens, as gateway run reads them from the environment")
	tokensFile := fs.String("tokens-file", "", "the admin API tokens file (default $GATEWAY_TOKENS_FILE; without a file, the tokens of $"+admin.EnvTokens+"), as gateway run reads them")
	// $GATEWAY_TOKENS_FILE as gateway run reads it: a file, from the flag
	// or the variable, wins over $GATEWAY_TOKENS.
	if code, ok := a.parseOnlyWithEnv(fs, args, "tokens-file"); !ok {
		return code
	}
	if !*fromFlags {
		return a.fail(badInput("from_flags", "usage: gateway policy init --from-flags (the only source so far)"))
	}
	tokens, err := loadTokens(*tokensFile, a.getenv, slog.New(slog.NewTextHandler(a.stderr, nil)))
	if err != nil {
		return a.fail(err)
	}
	scope := cmp.Or(a.getenv("GATEWAY_KEY_SCOPE"), policy.KeyScopeGlobal)
	var d policy.Document
	for _, t := range tokens {
		p := policy.Principal{Name: cmp.Or(t.Principal, t.Name), Role: string(t.Role), Resources: t.Resources, Kinds: t.Kinds,
			Epochs: t.Epochs, KeyScope: scope}
		if len(p.Resources) == 0 {
			p.Resources = []string{policy.All}
		}
		if len(p.Kinds) == 0 && p.Role == policy.RoleWorker {
			p.Kinds = []string{policy.All}
		}
		if slices.ContainsFunc(d.Principals, func(q policy.Principal) bool { return q.Name == p.Name }) {
			continue // tokens naming one principal: the first one's scope
		}
		d.Principals = append(d.Principals, p)
	}
	if len(d.Principals) == 0 {
		return a.fail(badInput("tokens", "no admin API tokens (--tokens-file, $GATEWAY_TOKENS_FILE, $"+admin.EnvTokens+") to derive principals from: a rule set needs at least one (write it by hand, see docs/policy.md)"))
	}
	list := func(env string) []string {
		return strings.FieldsFunc(a.getenv(env), func(r rune) bool { return r == ',' || r == ' ' })
	}
	if from, rcpt := list("GATEWAY_MAIL_FROM_ALLOW"), list("GATEWAY_MAIL_RCPT_ALLOW"); len(from)+len(rcpt) > 0 {
		d.Destinations.Email = &policy.EmailRules{Senders: from, RecipientDomains: rcpt}
	}
	if hosts := list("GATEWAY_WEBHOOK_ALLOW"); len(hosts) > 0 {
		d.Destinations.Webhook = &policy.WebhookRules{Hosts: hosts}
	}
	if targets := list("GATEWAY_FILE_ALLOW"); len(targets) > 0 {
		d.Destinations.File = &policy.FileRules{Targets: targets}
	}
	if buckets := append(list("GATEWAY_S3_BUCKET"), list("GATEWAY_S3_ALLOW")...); len(buckets) > 0 {
		d.Destinations.S3 = &policy.S3Rules{Buckets: buckets}
	}
	// What the flags allow but the rule set's stricter forms cannot say
	// (a file pattern with a character class, say) is refused here, naming
	// the field: fix it by hand.
	if err := d.Validate(); err != nil {
		return a.fail(err)
	}
	a.writeJSON(d)
	return exitOK
}
