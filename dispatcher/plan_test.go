package dispatcher_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// Every statement of a claim's transaction (the claim, the mark) reaches
// the intents by an ordered probe of an index, planned once per
// connection, whatever the statistics say. On an intents table whose
// statistics show few pending intents — any table that settles what it
// relays — the claim's pending scan was planned as a bitmap scan of
// intents_pending_idx followed by a sort. A bitmap scan visits every heap
// row the index names, dead ones included, and never marks a dead entry
// as such, so each claim read every intent relayed since the last vacuum
// of the table (at a steady 500 /s: up to 3.4 ms a claim, 34–42 % of
// PostgreSQL's statement time in some runs of `gateway bench --case e2e-latency`).
// An ordered index scan stops at the first live pending rows and marks
// the dead entries it passes, so the next claim skips them. The
// statements checked are those the dispatcher really ran (caught by a
// tracer), with the arguments it passed. Fails on the claim transaction
// of e4f3c42 (a custom plan: Bitmap Heap Scan and Sort).
func TestClaimPlansProbeAndAreKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const ttl = 17 * time.Second
	seen := &testdb.TxStatements{Begin: intents.ClaimTxBegin(ttl)}
	pool := testdb.NewTracedPool(t, seen)
	srv := natstest.Start(t)
	e := &env{t: t, pool: pool, url: srv.URL, ob: coretest.Outbox(t, pool), ls: coretest.Issuer(pool)}

	d := e.start(dispatcher.Config{Schema: testdb.Schema(), ClaimTTL: ttl, PollInterval: 50 * time.Millisecond})
	epoch := e.acquire("plan")
	for i := range 5 {
		if _, err := e.ob.Enqueue(ctx, fileIntent("plan", epoch, fmt.Sprintf("op-%d", i), 100)); err != nil {
			t.Fatal(err)
		}
	}
	e.waitAllRelayed(10 * time.Second)
	d.Stop()
	stmts := seen.Statements()
	for _, want := range []string{"WITH stale AS", "relay_count = relay_count + 1"} {
		if !slices.ContainsFunc(stmts, func(s string) bool { return strings.Contains(s, want) }) {
			t.Fatalf("no claim's transaction ran a statement with %q (%d statements seen): the test proves nothing", want, len(stmts))
		}
	}

	// A table that settles what it relays: analyzed while few of its
	// intents were pending, then 20,000 more relayed and settled since
	// (no vacuum), a few still pending.
	for _, q := range []string{
		`ALTER TABLE fencegate.intents SET (autovacuum_enabled = false)`,
		`INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
			SELECT 'r-' || g, 1, 'op-' || g, 'file', 'k-' || g, 'execute', '{}' FROM generate_series(1, 2000) g`,
		`UPDATE fencegate.intents SET status = 'succeeded' WHERE intent_id <= (SELECT max(intent_id) - 50 FROM fencegate.intents)`,
		`ANALYZE fencegate.intents`,
		`INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
			SELECT 'r-' || g, 1, 'op-' || g, 'file', 'k-' || g, 'execute', '{}' FROM generate_series(2001, 22000) g`,
		`UPDATE fencegate.intents SET status = 'relayed', relayed_at = now() WHERE status = 'pending' AND intent_id < (SELECT max(intent_id) - 10 FROM fencegate.intents)`,
		`UPDATE fencegate.intents SET status = 'succeeded' WHERE status = 'relayed' AND intent_id < (SELECT max(intent_id) - 20 FROM fencegate.intents)`,
	} {
		if _, err := pool.Exec(ctx, testdb.SQL(q)); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	checked := 0
	for _, stmt := range stmts {
		args := seen.Args(stmt)
		lits := make([]string, len(args))
		for j, a := range args {
			lits[j] = literal(t, a)
		}
		// The arguments the dispatcher passed (the claim's cursor at 0:
		// the claim every wake-up starts with).
		plan := testdb.PreparedPlan(t, pool, intents.ClaimTxBegin(ttl), stmt, lits)
		scans := intentScan.FindAllString(plan, -1)
		for _, s := range scans {
			if !strings.HasPrefix(s, "Index Scan") && !strings.HasPrefix(s, "Index Only Scan") {
				t.Errorf("%q is not an ordered probe of an index:\n%s\n%s", s, stmt, plan)
			}
		}
		if strings.Contains(plan, "Sort") {
			t.Errorf("the plan sorts what it read instead of reading it in order:\n%s\n%s", stmt, plan)
		}
		if len(scans) > 0 {
			checked++
		}
	}
	if checked == 0 {
		t.Fatalf("none of the %d statements read the intents: the test proves nothing", len(stmts))
	}
	if !t.Failed() {
		t.Logf("%d statements of claims' transactions read the intents: each a generic plan, every scan an ordered index probe", checked)
	}
}

// intentScan matches a plan node that reads the intents.
var intentScan = regexp.MustCompile(`[A-Z][A-Za-z ]*Scan(?: using \S+)? on intents\b`)

// literal writes a to SQL, for the arguments a dispatcher passes.
func literal(t *testing.T, a any) string {
	t.Helper()
	switch v := a.(type) {
	case int64:
		return strconv.FormatInt(v, 10)
	case []int64:
		s := make([]string, len(v))
		for i, n := range v {
			s[i] = strconv.FormatInt(n, 10)
		}
		return "ARRAY[" + strings.Join(s, ",") + "]::bigint[]"
	case []string:
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = "'" + strings.ReplaceAll(x, "'", "''") + "'"
		}
		return "ARRAY[" + strings.Join(s, ",") + "]::text[]"
	default:
		t.Fatalf("an argument of type %T: add it to literal", a)
		return ""
	}
}
