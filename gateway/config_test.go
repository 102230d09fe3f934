package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/outbox"
)

// TestConfigRules: a program that embeds Config gets every component's
// rules, and those between components, from Validate, with errors naming
// the field's path in Config — not only `gateway run`'s flags.
func TestConfigRules(t *testing.T) {
	t.Parallel()
	relay := &dispatcher.Config{}
	cases := []struct {
		name  string
		cfg   Config
		field string // "": valid
	}{
		{"defaults", Config{Dispatcher: relay}, ""},
		{"deprecated RunDispatcher", Config{RunDispatcher: true}, ""},
		{"nothing to run", Config{}, "Adapters"},
		{"max attempts", Config{Dispatcher: relay, Runtime: executor.Config{MaxAttempts: -1}}, "Runtime.MaxAttempts"},
		{"concurrency", Config{Dispatcher: relay, Runtime: executor.Config{Concurrency: -1}}, "Runtime.Concurrency"},
		{"unknown policy", Config{Dispatcher: relay, Runtime: executor.Config{Unknown: "retry"}}, "Runtime.Unknown"},
		{"execute timeout", Config{Dispatcher: relay, Runtime: executor.Config{ExecuteTimeout: -time.Second}}, "Runtime.ExecuteTimeout"},
		{"ack wait set too short", Config{Dispatcher: relay, Runtime: executor.Config{ExecuteTimeout: time.Minute, AckWait: time.Minute}}, "Runtime.AckWait"},
		// AckWait unset follows ExecuteTimeout (twice it): no error.
		{"ack wait derived", Config{Dispatcher: relay, Runtime: executor.Config{ExecuteTimeout: 90 * time.Second},
			Idempotency: idempotency.Config{LockTimeout: 5 * time.Minute}}, ""},
		{"key lock within twice the execute timeout", Config{Dispatcher: relay, Runtime: executor.Config{ExecuteTimeout: time.Minute},
			Idempotency: idempotency.Config{LockTimeout: 2 * time.Minute}}, "Idempotency.LockTimeout"},
		{"execute timeout past the default key lock", Config{Dispatcher: relay, Runtime: executor.Config{ExecuteTimeout: 3 * time.Minute}}, "Idempotency.LockTimeout"},
		{"key lock out of range", Config{Dispatcher: relay, Idempotency: idempotency.Config{LockTimeout: 25 * time.Hour}}, "Idempotency.LockTimeout"},
		{"dispatcher rule", Config{Dispatcher: &dispatcher.Config{BatchSize: 5000, MaxInFlight: 4096}}, "Dispatcher.MaxInFlight"},
		{"dispatcher off: its fields unchecked", Config{Adapters: []adapters.Registration{{Kind: "k", Spec: outbox.KindSpec{DefaultFence: outbox.FenceCommit}, Executor: noop("k")}}}, ""},
		{"retention", Config{Dispatcher: relay, Retention: outbox.SweeperConfig{MaxAge: time.Hour}}, "Retention.MaxAge"},
		{"ping interval", Config{Dispatcher: relay, NATSPingInterval: -time.Second}, "NATSPingInterval"},
		{"nats url scheme", Config{Dispatcher: relay, NATSURL: "http://127.0.0.1:4222"}, "NATSURL"},
		{"nats url empty seed", Config{Dispatcher: relay, NATSURL: "nats://a:4222,,nats://b:4222"}, "NATSURL"},
		{"nats url seeds", Config{Dispatcher: relay, NATSURL: "nats://a:4222, tls://b:4222,c:4222,wss://d"}, ""},
		{"namespace", Config{Dispatcher: relay, Namespace: "Not A Namespace"}, "Namespace"},
		{"key scope", Config{Dispatcher: relay, KeyScope: "tenant"}, "KeyScope"},
		{"key scope resource", Config{Dispatcher: relay, KeyScope: outbox.KeyScopeResource}, ""},
		{"admin without tokens off loopback", Config{Dispatcher: relay, AdminAddr: "0.0.0.0:8080"}, "AdminAddr"},
		// Tokens are checked by Validate, before anything connects (not
		// only when the admin server is made), whether or not it runs.
		{"a token's role", Config{Dispatcher: relay, AdminAddr: "127.0.0.1:0", Tokens: []admin.Token{{Name: "ops", Role: "root", Secret: strongSecret}}}, "Tokens"},
		{"a weak token", Config{Dispatcher: relay, Tokens: []admin.Token{{Name: "ops", Role: admin.RoleOperator, Secret: "short"}}}, "Tokens"},
		{"a secret twice", Config{Dispatcher: relay, AdminAddr: "127.0.0.1:0", Tokens: []admin.Token{
			{Name: "ops", Role: admin.RoleOperator, Secret: strongSecret}, {Name: "job", Role: admin.RoleWorker, Secret: strongSecret}}}, "Tokens"},
		{"tokens", Config{Dispatcher: relay, AdminAddr: "127.0.0.1:0", Tokens: []admin.Token{{Name: "ops", Role: admin.RoleOperator, Secret: strongSecret}}}, ""},
		{"schema", Config{Dispatcher: relay, Schema: "Bad-Schema"}, "Schema"},
		{"a part's schema", Config{Dispatcher: relay, Idempotency: idempotency.Config{Schema: "other"}}, "Idempotency.Schema"},
	}
	checked := 0
	for _, c := range cases {
		err := c.cfg.Validate()
		var inv *fenceerr.InvalidError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%s: Validate = %v, want nil", c.name, err)
		case c.field != "" && (!errors.As(err, &inv) || inv.Field != c.field):
			t.Errorf("%s: Validate = %v, want an invalid-input error naming %s", c.name, err, c.field)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no case checked")
	}
	t.Logf("%d configurations checked", checked)
}

// A NATSURL seed that nats.go would not read as the redaction does is
// refused naming NATSURL, never echoed: a seed without a scheme (dialled
// as nats://seed) was not checked, and nats.go's parse error quoted it,
// password included; an '@' past the host (a password with an unencoded
// '/') left the password's tail in the URL shown as redacted.
func TestNATSURLNotEchoed(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"u:PWsecret%zz@127.0.0.1:4222",
		"nats://127.0.0.1:4222,u:PWsecret%zz@127.0.0.1:4222",
		"u:PWsecret/x@127.0.0.1:4222",
		"nats://u:4711/PWsecret@127.0.0.1:4222",
		"tls://u:4711/PWsecret@127.0.0.1:4222",
		"nats://127.0.0.1:4222/?x=PWsecret@h",
	} {
		cfg := Config{Dispatcher: &dispatcher.Config{}, NATSURL: u}
		err := cfg.Validate()
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != "NATSURL" {
			t.Errorf("NATSURL %q: Validate = %v, want an invalid-input error naming NATSURL", u, err)
		}
		if err != nil && (strings.Contains(err.Error(), "PWsecret") || strings.Contains(err.Error(), "4711")) {
			t.Errorf("NATSURL %q: the error shows the password: %v", u, err)
		}
	}
	// What nats.go reads alike: a password with an encoded '@', an '@'
	// in the user info only.
	for _, u := range []string{"u:p%40w@127.0.0.1:4222", "nats://u:p%40w@127.0.0.1:4222/", "tok@h:4222"} {
		cfg := Config{Dispatcher: &dispatcher.Config{}, NATSURL: u}
		if err := cfg.Validate(); err != nil {
			t.Errorf("NATSURL %q: Validate = %v, want nil", u, err)
		}
	}
}

// strongSecret passes the admin tokens' strength rule.
const strongSecret = "gq7Rk2Lw9ZpX4vNt8YcB3mHs6JdF5aQe"

// noop is an executor of kind that does nothing.
type noop string

func (k noop) Kind() string                      { return string(k) }
func (noop) Capabilities() adapters.Capabilities { return adapters.Capabilities{} }
func (noop) Execute(context.Context, adapters.Request) (adapters.Outcome, error) {
	return adapters.Outcome{}, nil
}
