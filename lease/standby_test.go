package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Epochs are never granted, and intents never enqueued, on a standby: a real
// streaming replica of a real primary refuses with ErrStandby and nothing is
// stored, while the primary works.
func TestNeverOnAStandby(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs := startReplicated(t, ctx)
	plain, standbyPlain := rs.ppool, rs.spool

	onPrimary := requirePrimaryPool(t, rs.primary.URL("postgres"))
	onStandby := requirePrimaryPool(t, rs.standby.URL("postgres"))
	if err := lease.CheckPrimary(ctx, onPrimary); err != nil {
		t.Fatalf("CheckPrimary(primary) = %v", err)
	}
	if err := lease.CheckPrimary(ctx, standbyPlain); !errors.Is(err, lease.ErrStandby) {
		t.Fatalf("CheckPrimary(standby) = %v; want ErrStandby", err)
	}

	// The standby must have replayed the schema, so that what refuses below
	// is the standby check, not a missing table.
	waitFor(t, "the standby replays the schema", time.Minute, func() (bool, error) {
		var n int
		err := standbyPlain.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'epoch_grants'`).Scan(&n)
		return n == 1, err
	})

	// With RequirePrimary: every call fails on connecting, with ErrStandby.
	iss := lease.NewIssuer(onStandby, lease.WithSchema(testdb.Schema()))
	if _, err := iss.Acquire(ctx, "r", "A", time.Minute); !errors.Is(err, lease.ErrStandby) {
		t.Fatalf("Acquire on standby = %v; want ErrStandby", err)
	}
	if _, err := iss.Advance(ctx, "r", 7); !errors.Is(err, lease.ErrStandby) {
		t.Fatalf("Advance on standby = %v; want ErrStandby", err)
	}
	if err := onStandby.Ping(ctx); !errors.Is(err, lease.ErrStandby) || !strings.Contains(err.Error(), "epochs must come from the primary") {
		t.Fatalf("Ping on standby = %v; want ErrStandby with a clear message", err)
	}
	client, err := outbox.New(onStandby, outbox.Config{Schema: testdb.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	in := outbox.Intent{Resource: "r", Epoch: 1, OperationID: "op-1", Kind: "email",
		Payload: json.RawMessage(`{"to":"alice@example.com","from":"reports@example.com","subject":"s","text":"t"}`)}
	if _, err := client.Enqueue(ctx, in); !errors.Is(err, lease.ErrStandby) {
		t.Fatalf("Enqueue on standby = %v; want ErrStandby", err)
	}
	// Without RequirePrimary the issuer still says why (the standby refuses
	// the write as read-only; the issuer checks pg_is_in_recovery()).
	if _, err := lease.NewIssuer(standbyPlain, lease.WithSchema(testdb.Schema())).Acquire(ctx, "r", "A", time.Minute); !errors.Is(err, lease.ErrStandby) {
		t.Fatalf("Acquire on standby without RequirePrimary = %v; want ErrStandby", err)
	}
	// Nothing was stored anywhere (the primary is where it would have been).
	var resources, intents int
	if err := plain.QueryRow(ctx, testdb.SQL(`SELECT (SELECT count(*) FROM fencegate.resources), (SELECT count(*) FROM fencegate.intents)`)).Scan(&resources, &intents); err != nil {
		t.Fatal(err)
	}
	if resources != 0 || intents != 0 {
		t.Fatalf("after refusals: %d resources, %d intents; want none", resources, intents)
	}

	// On the primary, through the same kind of pool: it works.
	piss := lease.NewIssuer(onPrimary, lease.WithSchema(testdb.Schema()))
	l, err := piss.Acquire(ctx, "r", "A", time.Minute)
	if err != nil || l.Epoch != 1 {
		t.Fatalf("Acquire on primary = %+v, %v", l, err)
	}
	pclient, _ := outbox.New(onPrimary, outbox.Config{Schema: testdb.Schema()})
	if _, err := pclient.Enqueue(ctx, in); err != nil {
		t.Fatalf("Enqueue on primary = %v", err)
	}
	// And the grant reaches the standby by replication, where reading the
	// history is allowed (it may lag; it never grants).
	waitFor(t, "the grant replicated to the standby's history", time.Minute, func() (bool, error) {
		grants, err := lease.NewIssuer(standbyPlain, lease.WithSchema(testdb.Schema())).History(ctx, "r", 10)
		return len(grants) == 1 && grants[0].Epoch == 1, err
	})
}
