package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// results returns the entries of a per-id action's {"results": [...]}.
func results(t *testing.T, r cliResult) []map[string]any {
	t.Helper()
	list, ok := r.obj["results"].([]any)
	if !ok {
		t.Fatalf("no results: %s", r.stdout)
	}
	var out []map[string]any
	for _, e := range list {
		out = append(out, e.(map[string]any))
	}
	return out
}

// errCode is the error code of a result entry, "" for a done action.
func errCode(e map[string]any) string {
	er, _ := e["error"].(map[string]any)
	c, _ := er["code"].(string)
	return c
}

// `gateway retry|cancel|resolve ID…` acts on each intent named through
// the operator package: one result per id, the action recorded with the
// actor cli:$USER; an intent that does not exist is not_found (exit 2),
// one whose status (or effect) does not allow the action invalid_state
// (exit 5), and every id is tried, the exit code that of the first that
// was not done. Bad input acts on none, database or not.
func TestActionsByID(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	acquireLease(t, db, "r")
	ctx := context.Background()
	id := map[string]string{}
	for _, op := range []string{"failed", "lost", "unknown", "pending", "done"} {
		id[op] = jsonNum(enqueue(t, db, "--resource", "r", "--epoch", "1", "--op", op, "--kind", "file", "--payload", `{"target":"`+op+`.txt","content":"x"}`))
	}
	if _, err := conn.Exec(ctx, testdb.SQL(`UPDATE fencegate.intents SET completed_at = now(),
		status = CASE operation_id WHEN 'failed' THEN 'failed' WHEN 'done' THEN 'succeeded' ELSE 'unknown' END,
		effect = CASE operation_id WHEN 'lost' THEN 'possible' WHEN 'done' THEN 'done' ELSE 'none' END
		WHERE operation_id <> 'pending'`)); err != nil {
		t.Fatal(err)
	}
	status := func(op string) string {
		t.Helper()
		r := gw(t, db, "status", id[op])
		s, _ := r.obj["status"].(string)
		return s
	}

	// Bad input, checked before connecting: nothing acted on.
	expectInvalidAnyDB(t, db, []invalidArgs{
		{[]string{"resolve", id["unknown"]}, "outcome"},
		{[]string{"resolve", id["unknown"], "--outcome", "maybe"}, "outcome"},
		{[]string{"retry", id["failed"], "x"}, "intent_id"},
		{[]string{"retry", "0"}, "intent_id"},
		{[]string{"retry", id["failed"], "--status", "failed"}, "intent_id"},
		{[]string{"cancel", "--kind", "file", id["pending"]}, "intent_id"},
		{[]string{"cancel", id["pending"], "--outcome", "failed"}, "outcome"},
		{[]string{"cancel", id["pending"], "--force"}, "flags"},
		{[]string{"retry", id["failed"], "--note", strings.Repeat("x", 4097)}, "note"},
	})
	for op, want := range map[string]string{"failed": "failed", "unknown": "unknown", "pending": "pending"} {
		if s := status(op); s != want {
			t.Fatalf("after bad input, %s intent is %s", op, s)
		}
	}

	// Flags before, between or after the ids.
	r := gw(t, db, "retry", "--note", "receiver fixed", id["failed"])
	expectCode(t, r, 0, "")
	res := results(t, r)
	if len(res) != 1 || res[0]["intent_id"] != jsonNumF(id["failed"]) || res[0]["action"] != "retry" || res[0]["from_status"] != "failed" ||
		res[0]["status"] != "pending" || res[0]["event_id"] == nil || r.stderr != "" {
		t.Fatalf("retry %s = %s, stderr %q", id["failed"], r.stdout, r.stderr)
	}
	var actor, note string
	if err := conn.QueryRow(ctx, testdb.SQL(`SELECT actor, note FROM fencegate.intent_events WHERE intent_id = $1 AND action = 'retry'`), id["failed"]).
		Scan(&actor, &note); err != nil || !strings.HasPrefix(actor, "cli:") || note != "receiver fixed" {
		t.Fatalf("retry event: actor %q, note %q, %v", actor, note, err)
	}

	// The effect may have happened: refused without --force, exit 5
	// invalid_state naming effect, as the API's 409.
	r = gw(t, db, "retry", id["lost"])
	if r.code != 5 {
		t.Fatalf("retry of an intent whose effect is possible: exit %d, %s; want 5", r.code, r.stdout)
	}
	res = results(t, r)
	if e, _ := res[0]["error"].(map[string]any); errCode(res[0]) != "invalid_state" || e["field"] != "effect" || e["effect"] != "possible" ||
		e["status"] != "unknown" || !strings.Contains(r.stderr, "intent "+id["lost"]+": ") || strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("retry %s = %s, stderr %q", id["lost"], r.stdout, r.stderr)
	}
	if s := status("lost"); s != "unknown" {
		t.Fatalf("refused retry changed the intent: %s", s)
	}
	r = gw(t, db, "retry", id["lost"], "--force", "--note", "nothing arrived")
	expectCode(t, r, 0, "")
	if res := results(t, r); res[0]["forced"] != true || res[0]["status"] != "pending" {
		t.Fatalf("retry --force = %s", r.stdout)
	}

	r = gw(t, db, "resolve", id["unknown"], "--outcome", "succeeded", "--note", "in the mailbox")
	expectCode(t, r, 0, "")
	if res := results(t, r); res[0]["status"] != "succeeded" || res[0]["from_status"] != "unknown" {
		t.Fatalf("resolve = %s", r.stdout)
	}

	// Several ids: each tried, one result each in order; the first that
	// was not done gives the exit code.
	const missing = "999999"
	r = gw(t, db, "cancel", id["pending"], missing, id["done"])
	if r.code != exitBadInput {
		t.Fatalf("cancel pending, missing, succeeded: exit %d, %s; want 2 (the first failure: not found)", r.code, r.stdout)
	}
	res = results(t, r)
	if len(res) != 3 || res[0]["status"] != "cancelled" || errCode(res[1]) != "not_found" || res[1]["intent_id"] != jsonNumF(missing) ||
		errCode(res[2]) != "invalid_state" || res[2]["action"] != "cancel" || strings.Count(r.stderr, "\n") != 2 {
		t.Fatalf("cancel %s %s %s = %s, stderr %q", id["pending"], missing, id["done"], r.stdout, r.stderr)
	}
	r = gw(t, db, "cancel", id["done"], missing)
	if r.code != 5 || errCode(results(t, r)[0]) != "invalid_state" {
		t.Fatalf("cancel succeeded, missing: exit %d, %s; want 5 (the first failure: invalid_state)", r.code, r.stdout)
	}
	// The same id twice is acted on once.
	r = gw(t, db, "retry", id["failed"], id["failed"])
	if r.code != 5 || len(results(t, r)) != 1 {
		t.Fatalf("retry of a pending intent twice: exit %d, %s; want one invalid_state", r.code, r.stdout)
	}
	for op, want := range map[string]string{"failed": "pending", "lost": "pending", "unknown": "succeeded", "pending": "cancelled", "done": "succeeded"} {
		if s := status(op); s != want {
			t.Errorf("%s intent ends %s, want %s", op, s, want)
		}
	}
	if n := testdb.Int(t, conn, `SELECT count(*) FROM fencegate.intent_events WHERE actor LIKE 'cli:%'`); n != 4 {
		t.Errorf("%d events recorded, want 4 (retry, forced retry, resolve, cancel)", n)
	}
}

func jsonNumF(s string) float64 {
	var f float64
	_, _ = fmt.Sscan(s, &f)
	return f
}

// A bulk dry run lists the first intents it would act on: in the JSON
// (ids) and on stderr for a person; nothing changes.
func TestBulkDryRunListsIDsCLI(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	acquireLease(t, db, "r")
	var ids []any
	for i := range 3 {
		op := fmt.Sprint("op-", i)
		ids = append(ids, enqueue(t, db, "--resource", "r", "--epoch", "1", "--op", op, "--kind", "file", "--payload", `{"target":"`+op+`.txt","content":"x"}`))
	}
	if _, err := conn.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET status = 'failed', completed_at = now()`)); err != nil {
		t.Fatal(err)
	}
	r := gw(t, db, "retry", "--status", "failed")
	expectCode(t, r, 0, "")
	if fmt.Sprint(r.obj["ids"]) != fmt.Sprint(ids) || r.obj["matched"] != 3.0 || r.obj["dry_run"] != true {
		t.Fatalf("dry run = %s; want ids %v", r.stdout, ids)
	}
	want := fmt.Sprintf("gateway retry: a dry run: 3 intents to retry (%s %s %s); nothing changed: add --yes to do it\n", jsonNum(ids[0]), jsonNum(ids[1]), jsonNum(ids[2]))
	if r.stderr != want {
		t.Fatalf("dry run's stderr = %q, want %q", r.stderr, want)
	}
	if n := testdb.Int(t, conn, `SELECT count(*) FROM fencegate.intents WHERE status = 'failed'`); n != 3 {
		t.Fatalf("a dry run changed intents: %d failed, want 3", n)
	}
	r = gw(t, db, "cancel", "--status", "pending")
	if _, ok := r.obj["ids"]; ok || r.stderr != "gateway cancel: a dry run: no intent to cancel\n" {
		t.Fatalf("dry run of nothing = %s, stderr %q", r.stdout, r.stderr)
	}
	r = gw(t, db, "retry", "--status", "failed", "--yes")
	if _, ok := r.obj["ids"]; ok || r.obj["applied"] != 3.0 {
		t.Fatalf("retry --yes = %s; want 3 applied, no ids", r.stdout)
	}
}

// --resource narrows a bulk action to one resource by its exact name, as
// the API's "resource" and the list page's bulk form do: billing's
// failed intents, not billing-eu's; --resource-prefix takes both.
func TestBulkResourceIsExactCLI(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	for _, res := range []string{"billing", "billing-eu"} {
		acquireLease(t, db, res)
		enqueue(t, db, "--resource", res, "--epoch", "1", "--op", "op-"+res, "--kind", "file", "--payload", `{"target":"`+res+`.txt","content":"x"}`)
	}
	if _, err := conn.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET status = 'failed', completed_at = now()`)); err != nil {
		t.Fatal(err)
	}
	if r := gw(t, db, "retry", "--status", "failed", "--resource-prefix", "billing"); r.obj["matched"] != 2.0 {
		t.Fatalf("--resource-prefix billing = %s; want 2 matched", r.stdout)
	}
	r := gw(t, db, "retry", "--status", "failed", "--resource", "billing", "--yes")
	expectCode(t, r, 0, "")
	if r.obj["matched"] != 1.0 || r.obj["applied"] != 1.0 {
		t.Fatalf("--resource billing --yes = %s; want 1 matched and applied", r.stdout)
	}
	if n := testdb.Int(t, conn, `SELECT count(*) FROM fencegate.intents WHERE status = 'failed' AND resource_id = 'billing-eu'`); n != 1 {
		t.Fatalf("billing-eu's intent was retried too (%d left failed, want 1)", n)
	}
}

// A bulk action's input is checked before connecting, with the rules of
// the run whether or not it is a dry run (a dry run must not plan what
// --yes refuses): exit 2 naming the field against a database that answers
// and one that does not, no intent changed.
func TestBulkChecksBeforeConnecting(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	acquireLease(t, db, "r")
	for _, op := range []string{"f", "u"} {
		enqueue(t, db, "--resource", "r", "--epoch", "1", "--op", op, "--kind", "file", "--payload", `{"target":"`+op+`.txt","content":"x"}`)
	}
	if _, err := conn.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET completed_at = now(),
		status = CASE operation_id WHEN 'f' THEN 'failed' ELSE 'unknown' END`)); err != nil {
		t.Fatal(err)
	}
	cases := []invalidArgs{
		{[]string{"retry", "--status", "bogus"}, "status"},
		{[]string{"retry"}, "status"},
		{[]string{"cancel", "--status", "succeeded", "--yes"}, "status"},
		{[]string{"retry", "--status", "failed", "--since", "yesterday"}, "since"},
		{[]string{"cancel", "--status", "failed", "--until", "later", "--yes"}, "until"},
		{[]string{"resolve", "--status", "unknown", "--outcome", "bogus"}, "outcome"},
		{[]string{"resolve", "--status", "unknown", "--outcome", "bogus", "--yes"}, "outcome"},
		{[]string{"resolve", "--status", "unknown", "--outcome", "unknown"}, "outcome"},
		{[]string{"resolve", "--status", "unknown", "--yes"}, "outcome"},
		{[]string{"retry", "--status", "failed", "--outcome", "succeeded"}, "outcome"},
		{[]string{"cancel", "--status", "failed", "--outcome", "failed"}, "outcome"},
		{[]string{"retry", "--status", "failed", "--note", strings.Repeat("n", 4097)}, "note"},
	}
	checked := 0
	for _, c := range cases {
		for _, url := range []string{db, unreachableDB} {
			r := gw(t, url, c.args...)
			if r.code != exitBadInput || errorField(r) != c.field {
				t.Errorf("%.80v: exit %d %s; want exit 2 naming %s", c.args, r.code, r.stdout, c.field)
				continue
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no case checked")
	}
	t.Logf("%d refusals checked (%d command lines, each with and without a database)", checked, len(cases))
	// A dry run's resolve may leave --outcome out: it counts, as the
	// API's and the pages' preview does.
	r := gw(t, db, "resolve", "--status", "unknown")
	expectCode(t, r, 0, "")
	if r.obj["dry_run"] != true || r.obj["matched"] != 1.0 {
		t.Errorf("a dry run's resolve without --outcome: %s; want a dry run matching 1", r.stdout)
	}
	if n := testdb.Int(t, conn, `SELECT count(*) FROM fencegate.intents WHERE status IN ('failed', 'unknown')`); n != 2 {
		t.Fatalf("refused bulk actions changed intents: %d failed or unknown, want 2", n)
	}
}
