package cli

import (
	"context"
	"flag"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/outbox"
)

// webhookAdapter is the webhook adapter (adapters/webhook): signed HTTP
// requests to the destinations of an allow-list the intake enforces too.
var webhookAdapter = builtinAdapter{kind: webhook.Kind, flags: newWebhookFlags, enqueueSpec: webhookEnqueueSpec}

type webhookFlags struct {
	allow, secret, dedups *string
	perHost               *int
}

func newWebhookFlags(fs *flag.FlagSet) adapterFlags {
	return &webhookFlags{
		allow:   fs.String("webhook-allow", "", "destinations the webhook adapter may call, host or host:port, comma-separated (required to run it); a listed name resolving to a loopback/private/link-local address is refused unless that address is listed too"),
		secret:  fs.String("webhook-secret", "", "Standard Webhooks signing secrets, whsec_<base64>, comma-separated for rotation (every request signed by each); default $GATEWAY_WEBHOOK_SECRET, none: unsigned"),
		dedups:  fs.String("webhook-dedups-on-key", "", "webhook destinations (host or host:port, comma-separated) that drop a second request with the same Idempotency-Key: a lost answer from them is resent with the same key"),
		perHost: fs.Int("webhook-max-concurrency-per-host", webhook.DefaultMaxConcurrencyPerHost, "webhook requests in flight to one host:port at most"),
	}
}

// optedIn: the allow-list is the opt-in, when --adapters is not given.
func (f *webhookFlags) optedIn() bool { return *f.allow != "" }

func (f *webhookFlags) config(env adapterEnv) webhook.Config {
	return webhook.Config{
		Allow:                 webhook.SplitList(*f.allow),
		Secrets:               webhook.SplitList(*f.secret),
		DedupsOnKey:           webhook.SplitList(*f.dedups),
		MaxConcurrencyPerHost: *f.perHost,
		LookupSettle:          0, // the runtime's --lookup-settle
		Logger:                env.log,
	}
}

func (f *webhookFlags) check(env adapterEnv, runs bool) error {
	if *f.perHost < 1 {
		return badInput("webhook_max_concurrency_per_host", "--webhook-max-concurrency-per-host must be at least 1")
	}
	if runs {
		// New connects to nothing: it checks the allow-lists and secrets.
		if _, err := webhook.New(f.config(env)); err != nil {
			return errmap.Map(err)
		}
	}
	return nil
}

func (f *webhookFlags) registration(_ context.Context, env adapterEnv) (adapters.Registration, error) {
	w, err := webhook.New(f.config(env))
	if err != nil {
		return adapters.Registration{}, errmap.Map(err)
	}
	return w.Registration(), nil
}

// webhookEnqueueSpec: where the allow-list is known to gateway enqueue too
// ($GATEWAY_WEBHOOK_ALLOW, as the gateway's), enqueue refuses a URL to a
// host not on it.
func webhookEnqueueSpec(getenv func(string) string) (outbox.KindSpec, bool) {
	allow := getenv("GATEWAY_WEBHOOK_ALLOW")
	if allow == "" {
		return outbox.KindSpec{}, false
	}
	w, err := webhook.New(webhook.Config{Allow: webhook.SplitList(allow)})
	if err != nil {
		return outbox.KindSpec{}, false
	}
	return w.KindSpec(), true
}
