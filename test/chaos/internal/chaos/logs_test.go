package chaos

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The commit-order logs record every grant and every intent, whichever
// way it is made: the Go clients (the session's search_path) and the SQL
// interface (fencegate's functions, their search_path pinned to
// fencegate's schema), in the test's schema.
func TestInstallLogs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	if err := InstallLogs(ctx, pool, testdb.Schema()); err != nil {
		t.Fatal(err)
	}
	l, err := coretest.Issuer(pool).Acquire(ctx, "res", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ob := coretest.Outbox(t, pool)
	if _, err := ob.Enqueue(ctx, outbox.Intent{Resource: "res", Epoch: l.Epoch, OperationID: "go-1", Kind: "file",
		Payload: json.RawMessage(`{"target":"r.txt","content":"x"}`)}); err != nil {
		t.Fatalf("enqueue through the Go client: %v", err)
	}
	var sqlEpoch int64
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT epoch FROM fencegate.acquire('res2', 'w', interval '1 minute')`)).Scan(&sqlEpoch); err != nil {
		t.Fatalf("acquire through the SQL interface: %v", err)
	}
	if _, err := pool.Exec(ctx, testdb.SQL(`SELECT * FROM fencegate.enqueue('res2', $1, 'sql-1', 'file', '{"target":"s.txt","content":"y"}')`), sqlEpoch); err != nil {
		t.Fatalf("enqueue through the SQL interface: %v", err)
	}
	var intents, grants int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM chaos.intent_log), (SELECT count(*) FROM chaos.grant_log)`).Scan(&intents, &grants); err != nil {
		t.Fatal(err)
	}
	t.Logf("logged: %d intents, %d grants (schema %s)", intents, grants, testdb.Schema())
	if intents != 2 || grants != 2 {
		t.Fatalf("logged %d intents and %d grants, want 2 and 2", intents, grants)
	}
	// The checker reads them back, joined with the intents.
	in, err := loadIntents(ctx, pool, testdb.PGSchema())
	if err != nil {
		t.Fatal(err)
	}
	if len(in) != 2 || in[0].Committed.IsZero() {
		t.Fatalf("loaded %+v, want 2 intents with commit timestamps", in)
	}
}
