package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type bundle struct {
	pool   *pgxpool.Pool
	issuer *lease.Issuer
	client *outbox.Client
}

func setup(t *testing.T) bundle {
	t.Helper()
	pool := testdb.New(t)
	c, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	return bundle{pool: pool, issuer: lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())), client: c}
}

// acquire takes the lease on resource for holder: the epoch a test writes
// with.
func (b bundle) acquire(t *testing.T, resource, holder string, ttl time.Duration) lease.Lease {
	t.Helper()
	l, err := b.issuer.Acquire(context.Background(), resource, holder, ttl)
	if err != nil {
		t.Fatalf("acquire %s for %s: %v", resource, holder, err)
	}
	return l
}

const emailPayload = `{"to":["alice@example.com"],"from":"reports@example.com","subject":"Nightly report","text":"all good"}`

func emailIntent(resource string, epoch int64, op string) outbox.Intent {
	return outbox.Intent{Resource: resource, Epoch: epoch, OperationID: op, Kind: "email", Payload: json.RawMessage(emailPayload)}
}

func countIntents(t *testing.T, pool *pgxpool.Pool, where string, args ...any) int {
	t.Helper()
	var n int
	q := "SELECT count(*) FROM fencegate.intents"
	if where != "" {
		q += " WHERE " + where
	}
	if err := pool.QueryRow(context.Background(), testdb.SQL(q), args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func expire(t *testing.T, pool *pgxpool.Pool, resource string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(),
		testdb.SQL(`UPDATE fencegate.resources SET lease_expires_at = now() - interval '1 millisecond' WHERE resource_id = $1`), resource); err != nil {
		t.Fatal(err)
	}
}
