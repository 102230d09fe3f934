package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func setup(t *testing.T) (*lease.Issuer, *pgxpool.Pool) {
	t.Helper()
	pool := testdb.New(t)
	return lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())), pool
}

// expire moves a lease's expiry into the past by PostgreSQL's clock, the
// deterministic stand-in for "the holder paused past its TTL".
func expire(t *testing.T, pool *pgxpool.Pool, resource string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(),
		testdb.SQL(`UPDATE fencegate.resources SET lease_expires_at = now() - interval '1 millisecond' WHERE resource_id = $1`), resource); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if ok && err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (last error: %v)", what, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// keeperEnds waits at most d for k's context to end and returns its cause;
// still trusting the lease after d fails the test, saying what it waited for.
func keeperEnds(t *testing.T, k *lease.Keeper, d time.Duration, what string) error {
	t.Helper()
	select {
	case <-k.Context().Done():
		return k.Err()
	case <-time.After(d):
		t.Fatalf("%s: the keeper still trusts its lease after %s", what, d)
		return nil
	}
}

// newOutbox is an outbox client on pool, in the test schema: for the tests
// that check an epoch is refused where it matters, at the write.
func newOutbox(t *testing.T, pool *pgxpool.Pool) *outbox.Client {
	t.Helper()
	ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

// startCluster starts a PostgreSQL cluster of the test's own, for a test
// that restarts, kills or replicates it, and migrates it; the pool is on
// its postgres database. Both end with the test.
func startCluster(t *testing.T, ctx context.Context, opts pgcluster.Options) (*pgcluster.Cluster, *pgxpool.Pool) {
	t.Helper()
	c, err := pgcluster.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	pool := newPool(t, ctx, c.URL("postgres"), nil)
	if _, err := testdb.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return c, pool
}

// replicated is a migrated primary and a streaming standby of it, each with
// a plain pool (no RequirePrimary) on its postgres database.
type replicated struct {
	primary, standby *pgcluster.Cluster
	ppool, spool     *pgxpool.Pool
}

// startReplicated starts a primary, migrates it and starts a standby of it;
// the standby may not have replayed the migration yet.
func startReplicated(t *testing.T, ctx context.Context) replicated {
	t.Helper()
	primary, ppool := startCluster(t, ctx, pgcluster.Options{Settings: map[string]string{
		"wal_level": "replica", "max_wal_senders": "5", "hot_standby": "on"}})
	standby, err := pgcluster.StartStandby(ctx, primary)
	if err != nil {
		t.Fatalf("start standby: %v", err)
	}
	t.Cleanup(func() { _ = standby.Stop() })
	spool := newPool(t, ctx, standby.URL("postgres"), nil)
	return replicated{primary: primary, standby: standby, ppool: ppool, spool: spool}
}

// requirePrimaryPool is a pool on url that refuses a standby
// (lease.RequirePrimary).
func requirePrimaryPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	return newPool(t, context.Background(), url, lease.RequirePrimary)
}

// newPool is a pool on url, closed at the test's end; configure, if not
// nil, changes its configuration first.
func newPool(t *testing.T, ctx context.Context, url string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
