package clients_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// Arguments of the wrong type are refused before anything is sent, with
// the clients' invalid-input error naming the field, the same field in
// every language; a lone surrogate in a string is refused too (it was
// replaced, so two operation ids became one). They were the driver's
// errors, each language's own (a function that does not exist, text that
// is not a bigint, an interval out of range).
func TestClientBadArguments(t *testing.T) {
	want := map[string]string{
		"enqueue epoch 1.5":                   "epoch",
		"enqueue epoch true":                  "epoch",
		"enqueue epoch 2^64":                  "epoch",
		"enqueue epoch NaN":                   "epoch",
		"enqueue epoch '1'":                   "epoch",
		"enqueue resource 5":                  "resource",
		"enqueue operation_id 5":              "operation_id",
		"enqueue kind 5":                      "kind",
		"enqueue key 5":                       "key",
		"enqueue fence true":                  "fence",
		"enqueue operation_id lone surrogate": "operation_id",
		"enqueue resource lone surrogate":     "resource",
		"enqueue payload lone surrogate":      "payload.text",
		"enqueue payload NaN":                 "payload.to[1]",
		"acquire ttl missing":                 "ttl",
		"acquire ttl '10s'":                   "ttl",
		"acquire ttl NaN":                     "ttl",
		"acquire ttl Infinity":                "ttl",
		"acquire holder 5":                    "holder",
		"acquire failover_epoch_jump 1.5":     "failover_epoch_jump",
		"renew epoch 1.5":                     "epoch",
		"renew ttl '10s'":                     "ttl",
		"release epoch true":                  "epoch",
	}
	eachLang(t, func(t *testing.T, _ lang, cmd []string, pool *pgxpool.Pool, dbURL string) {
		const resource = "notes"
		epoch := num(run(t, cmd, dbURL, "acquire", resource, "w", "60000")["epoch"])
		got := run(t, cmd, dbURL, "badargs", resource, itoa(epoch))
		cases, _ := got["cases"].(map[string]any)
		if len(cases) != len(want) {
			t.Errorf("the driver ran %d cases, want %d", len(cases), len(want))
		}
		for name, field := range want {
			c, _ := cases[name].(map[string]any)
			if c["error"] != "InvalidInputError" || c["field"] != field {
				t.Errorf("%s: %v; want InvalidInputError naming %s", name, c, field)
			}
		}
		if n := testdb.Int(t, pool, `SELECT count(*) FROM fencegate.intents`); n != 0 {
			t.Errorf("%d intents stored by calls refused", n)
		}
		if n := testdb.Int(t, pool, `SELECT count(*) FROM fencegate.epoch_grants WHERE resource_id = $1`, resource); n != 1 {
			t.Errorf("%d grants of %s, want the first one only", n, resource)
		}
	})
}
