package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// Operation-id dedup lasts as long as the intent is kept; business-key
// dedup as long as the key. A sweeper that would delete intents while their
// keys live on is refused, naming its Go field MaxAge (CheckRetention, a
// function of two durations, names the concept: intent_retention); the
// defaults agree.
func TestSweeperRetentionHorizons(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const day = 24 * time.Hour
	if outbox.DefaultKeyRetention != idempotency.DefaultRetention {
		t.Fatalf("DefaultKeyRetention %s, idempotency.DefaultRetention %s: the defaults disagree",
			outbox.DefaultKeyRetention, idempotency.DefaultRetention)
	}
	if outbox.DefaultSweepMaxAge < idempotency.DefaultRetention {
		t.Fatalf("default intent retention %s is shorter than the default key retention %s",
			outbox.DefaultSweepMaxAge, idempotency.DefaultRetention)
	}
	if err := outbox.CheckRetention(0, 0); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	for _, c := range []struct {
		maxAge, keys time.Duration
		ok           bool
	}{
		{0, 0, true},
		{7 * day, 0, false}, // the old default intent retention against the default key retention
		{7 * day, 30 * day, false},
		{30*day - time.Second, 30 * day, false},
		{30 * day, 30 * day, true},
		{60 * day, 30 * day, true},
		{7 * day, 7 * day, true},
		{0, 31 * day, false},
	} {
		_, err := outbox.NewSweeper(b.pool, outbox.SweeperConfig{Schema: testdb.Schema(), MaxAge: c.maxAge, KeyRetention: c.keys})
		checkErr := outbox.CheckRetention(c.maxAge, c.keys)
		if c.ok {
			if err != nil || checkErr != nil {
				t.Errorf("MaxAge %s, KeyRetention %s: NewSweeper %v, CheckRetention %v", c.maxAge, c.keys, err, checkErr)
			}
			continue
		}
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != "MaxAge" || !strings.Contains(ve.Message, "key retention") {
			t.Errorf("MaxAge %s, KeyRetention %s: %v; want a ValidationError naming MaxAge", c.maxAge, c.keys, err)
		}
		if !errors.As(checkErr, &ve) || ve.Field != "intent_retention" || !strings.Contains(ve.Message, "key retention") {
			t.Errorf("CheckRetention(%s, %s) = %v; want a ValidationError naming intent_retention", c.maxAge, c.keys, checkErr)
		}
	}
}

// With the default retentions, an intent that completed 8 days ago (past
// the old 7-day intent retention, well inside the 30-day key retention)
// survives both sweepers, so a late replay of its operation id is a
// duplicate of it — not a new intent answered from the key with the old
// outcome.
func TestLateReplayInsideKeyRetentionIsDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "r", "A", time.Hour)
	in := emailIntent("r", l.Epoch, "late")
	res, err := b.client.Enqueue(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	store, err := idempotency.New(b.pool, idempotency.Config{Schema: testdb.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.client.Get(ctx, res.IntentID)
	if err != nil {
		t.Fatal(err)
	}
	d, err := store.Begin(ctx, rec.Kind, rec.IdempotencyKey, idempotency.Fingerprint(rec.Kind, rec.Payload), res.IntentID)
	if err != nil || d.Outcome != idempotency.OutcomeExecute {
		t.Fatalf("Begin = %+v, %v", d, err)
	}
	if _, err := store.Complete(ctx, idempotency.Completion{Kind: rec.Kind, Key: rec.IdempotencyKey, Token: d.Token,
		IntentID: res.IntentID, Status: outbox.StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE fencegate.intents SET completed_at = now() - interval '8 days'`,
		`UPDATE fencegate.idempotency_keys SET completed_at = now() - interval '8 days'`,
	} {
		if _, err := b.pool.Exec(ctx, testdb.SQL(q)); err != nil {
			t.Fatal(err)
		}
	}
	sw, err := outbox.NewSweeper(b.pool, outbox.SweeperConfig{Schema: testdb.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sw.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := b.client.Enqueue(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate || again.IntentID != res.IntentID || again.Status != outbox.StatusSucceeded {
		t.Fatalf("late replay = %+v; want a duplicate of intent %d (succeeded)", again, res.IntentID)
	}
}
