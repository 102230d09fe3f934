package cli

import (
	"errors"
	"testing"
	"time"

	"github.com/fencegate/fencegate/gateway"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// The stack wires both sweepers (gateway run and gateway dev): its
// configuration refuses an intent retention shorter than the key retention
// (operation-id dedup would end while business-key dedup goes on), naming
// intent_retention, and its defaults — what gateway dev runs with — agree.
func TestStackRetentionHorizons(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	field := func(err error) any {
		var ce *cliError
		if !errors.As(err, &ce) || ce.Exit() != exitBadInput {
			return nil
		}
		return ce.Field
	}
	for _, c := range []struct {
		name         string
		intents, key time.Duration
		ok           bool
	}{
		{"defaults", 0, 0, true},
		{"equal", 7 * day, 7 * day, true},
		{"intents longer", 90 * day, 30 * day, true},
		{"intents 7d, keys default", 7 * day, 0, false},
		{"intents 7d, keys 30d", 7 * day, 30 * day, false},
		{"intents default, keys longer", 0, 31 * day, false},
	} {
		cfg := gateway.Config{Schema: testdb.Schema(), RunDispatcher: true,
			Retention:   outbox.SweeperConfig{Schema: testdb.Schema(), MaxAge: c.intents},
			Idempotency: idempotency.Config{Schema: testdb.Schema(), Retention: c.key}}
		// As gateway run reports it: the gateway's field
		// (Retention.MaxAge) as the flag's (intent_retention).
		err := flagError(cfg.Validate())
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && field(err) != "intent_retention" {
			t.Errorf("%s: %v; want bad input naming intent_retention", c.name, err)
		}
	}
}
