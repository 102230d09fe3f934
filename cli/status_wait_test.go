package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/operator"
)

// `gateway status --wait D` prints the intent once it reaches a final
// status (woken by the outcome notification), or as it is when D has
// passed; a negative wait is exit 2 naming wait.
func TestStatusWait(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	acquireLease(t, db, "r")
	id := enqueue(t, db, "--resource", "r", "--epoch", "1", "--op", "o", "--kind", "file", "--payload", `{"target":"x.txt","content":"x"}`)
	r := gw(t, db, "status", "--wait", "300ms", jsonNum(id))
	expectCode(t, r, 0, "")
	if r.obj["status"] != "pending" {
		t.Fatalf("status --wait past its end: %s, want pending", r.stdout)
	}
	expectCode(t, gw(t, db, "status", "--wait", "-1s", jsonNum(id)), 2, "invalid_input")

	done := make(chan cliResult, 1)
	start := time.Now()
	go func() { done <- gw(t, db, "status", "--wait", "30s", jsonNum(id)) }()
	// Once the waiting process listens, an operator cancels the intent.
	pollUntil(t, 15*time.Second, "gateway status --wait to listen", func() (bool, string) {
		n := testdb.Int(t, conn, `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN `+testdb.PGSchema().OutcomesChannel()+`'`)
		return n > 0, "no LISTEN session"
	})
	if _, err := conn.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET status = 'cancelled', completed_at = now() WHERE intent_id = $1`), id); err != nil {
		t.Fatal(err)
	}
	r = <-done
	expectCode(t, r, 0, "")
	if r.obj["status"] != "cancelled" || time.Since(start) > 15*time.Second {
		t.Fatalf("status --wait: %s after %s; want cancelled, soon", r.stdout, time.Since(start))
	}
}

// `gateway retry --status failed …` is a dry run without --yes (how many it
// would touch, nothing changed) and does it with --yes, recording the
// actor cli:$USER; a bad filter is exit 2 naming the field.
func TestBulkRetryCLI(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	acquireLease(t, db, "reports/x")
	var ids []string
	for _, op := range []string{"a", "b"} {
		ids = append(ids, jsonNum(enqueue(t, db, "--resource", "reports/x", "--epoch", "1", "--op", op, "--kind", "file", "--payload", `{"target":"`+op+`.txt","content":"x"}`)))
	}
	if _, err := conn.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET status = 'failed', completed_at = now()`)); err != nil {
		t.Fatal(err)
	}
	r := gw(t, db, "retry", "--status", "failed", "--kind", "file", "--since", "1h")
	expectCode(t, r, 0, "")
	if r.obj["dry_run"] != true || r.obj["matched"] != 2.0 || r.obj["applied"] != 0.0 {
		t.Fatalf("dry run: %s", r.stdout)
	}
	r = gw(t, db, "retry", "--status", "failed", "--kind", "file", "--since", "1h", "--note", "fixed", "--yes")
	expectCode(t, r, 0, "")
	if r.obj["applied"] != 2.0 {
		t.Fatalf("retry --yes: %s", r.stdout)
	}
	for _, id := range ids {
		if st := gw(t, db, "status", id); st.obj["status"] != "pending" {
			t.Errorf("intent %s: %s, want pending", id, st.stdout)
		}
	}
	var actor string
	if err := conn.QueryRow(context.Background(), testdb.SQL(`SELECT actor FROM fencegate.intent_events WHERE action = 'retry' LIMIT 1`)).Scan(&actor); err != nil || !strings.HasPrefix(actor, "cli:") {
		t.Errorf("actor %q %v, want cli:…", actor, err)
	}
	expectInvalid(t, gw(t, db, "retry", "--kind", "file"), "status")
}

// `gateway status` prints the intent's effect and not_before; `gateway
// retry` skips the intents whose effect is possible, counting them
// (skipped.effect_possible, and a line on stderr saying why), exit 0 like
// every skip, and retries them with --force; `gateway cancel` skips them
// and has no --force (exit 2).
func TestBulkRetryEffectPossibleCLI(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	acquireLease(t, db, "r")
	lost := jsonNum(enqueue(t, db, "--resource", "r", "--epoch", "1", "--op", "lost", "--kind", "file", "--payload", `{"target":"lost.txt","content":"x"}`))
	plain := jsonNum(enqueue(t, db, "--resource", "r", "--epoch", "1", "--op", "plain", "--kind", "file", "--payload", `{"target":"plain.txt","content":"x"}`))
	ctx := context.Background()

	// A pending intent: effect none, no deferred retry.
	r := gw(t, db, "status", plain)
	expectCode(t, r, 0, "")
	if v, ok := r.obj["not_before"]; r.obj["effect"] != "none" || !ok || v != nil {
		t.Fatalf("status = %s; want effect none, not_before null", r.stdout)
	}
	// A deferred retry after a lost outcome, as the runtime records it.
	if _, err := conn.Exec(ctx, testdb.SQL(`UPDATE fencegate.intents SET effect = 'possible', not_before = '2030-01-02T03:04:05.678Z' WHERE intent_id = $1`), lost); err != nil {
		t.Fatal(err)
	}
	r = gw(t, db, "status", lost)
	expectCode(t, r, 0, "")
	nb, _ := r.obj["not_before"].(string)
	if got, err := time.Parse(time.RFC3339Nano, nb); r.obj["effect"] != "possible" || err != nil || !got.Equal(time.Date(2030, 1, 2, 3, 4, 5, 678e6, time.UTC)) {
		t.Fatalf("status = %s; want effect possible, not_before 2030-01-02T03:04:05.678Z", r.stdout)
	}

	// Both end: one unknown (its effect possible), one failed.
	if _, err := conn.Exec(ctx, testdb.SQL(`UPDATE fencegate.intents SET status = CASE WHEN effect = 'possible' THEN 'unknown' ELSE 'failed' END,
		not_before = NULL, completed_at = now()`)); err != nil {
		t.Fatal(err)
	}
	skipped := func(r cliResult) map[string]any {
		m, _ := r.obj["skipped"].(map[string]any)
		return m
	}
	r = gw(t, db, "retry", "--status", "unknown")
	expectCode(t, r, 0, "")
	if r.obj["matched"] != 1.0 || skipped(r)["effect_possible"] != 1.0 || !strings.Contains(r.stderr, "1 intent would be skipped") ||
		!strings.Contains(r.stderr, "may have happened") || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("dry run: %s, stderr %q", r.stdout, r.stderr)
	}
	r = gw(t, db, "retry", "--status", "unknown", "--yes")
	expectCode(t, r, 0, "")
	if r.obj["applied"] != 0.0 || skipped(r)["effect_possible"] != 1.0 || !strings.Contains(r.stderr, "1 intent skipped") {
		t.Fatalf("retry --yes: %s, stderr %q", r.stdout, r.stderr)
	}
	if st := gw(t, db, "status", lost); st.obj["status"] != "unknown" {
		t.Fatalf("retried without --force: %s", st.stdout)
	}
	r = gw(t, db, "cancel", "--status", "unknown", "--yes")
	expectCode(t, r, 0, "")
	if r.obj["applied"] != 0.0 || skipped(r)["effect_possible"] != 1.0 || strings.Contains(r.stderr, "--force") {
		t.Fatalf("cancel --yes: %s, stderr %q", r.stdout, r.stderr)
	}
	r = gw(t, db, "cancel", "--status", "unknown", "--force")
	expectCode(t, r, 2, "invalid_input")

	// The failed one (effect none) is retried without --force, nothing
	// said on stderr.
	r = gw(t, db, "retry", "--status", "failed", "--yes")
	expectCode(t, r, 0, "")
	if r.obj["applied"] != 1.0 || len(skipped(r)) != 0 || r.stderr != "" {
		t.Fatalf("retry failed: %s, stderr %q", r.stdout, r.stderr)
	}

	// --force: retried, recorded forced, the effect still possible.
	r = gw(t, db, "retry", "--status", "unknown", "--force", "--note", "nothing arrived", "--yes")
	expectCode(t, r, 0, "")
	if r.obj["applied"] != 1.0 || len(skipped(r)) != 0 || r.stderr != "" {
		t.Fatalf("retry --force: %s, stderr %q", r.stdout, r.stderr)
	}
	if st := gw(t, db, "status", lost); st.obj["status"] != "pending" || st.obj["effect"] != "possible" {
		t.Fatalf("after retry --force: %s", st.stdout)
	}
	var note string
	if err := conn.QueryRow(ctx, testdb.SQL(`SELECT note FROM fencegate.intent_events WHERE intent_id = $1 AND action = 'retry'`), lost).Scan(&note); err != nil ||
		note != operator.ForcedNote+"; nothing arrived" {
		t.Fatalf("event note %q %v", note, err)
	}
}

// `gateway status` takes its flags before, between or after the intent
// id, as retry, cancel and resolve take theirs; a second id is exit 2
// naming args.
func TestStatusFlagsAroundID(t *testing.T) {
	t.Parallel()
	db, _ := migratedDB(t)
	acquireLease(t, db, "r")
	id := jsonNum(enqueue(t, db, "--resource", "r", "--epoch", "1", "--op", "o", "--kind", "file", "--payload", `{"target":"x.txt","content":"x"}`))
	lines := [][]string{
		{"status", "--wait", "100ms", id, "-o", "json"},
		{"status", id, "-o", "json", "--wait", "100ms"},
		{"status", "-o", "json", id, "--wait", "100ms"},
		{"status", "-o", "json", "--wait", "100ms", id},
	}
	for _, args := range lines {
		r := gw(t, db, args...)
		expectCode(t, r, 0, "")
		if jsonNum(r.obj["intent_id"]) != id {
			t.Fatalf("%v: %s, want intent %s", args, r.stdout, id)
		}
	}
	if len(lines) == 0 {
		t.Fatal("nothing checked")
	}
	t.Logf("%d command lines checked", len(lines))
	expectInvalid(t, gw(t, unreachableDB, "status", "--wait", "1s", "1", "-o", "json", "2"), "args")
	expectInvalid(t, gw(t, unreachableDB, "status", "--wait", "-1s", "1", "-o", "json"), "wait")
}
