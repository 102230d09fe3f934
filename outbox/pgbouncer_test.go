package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/pgbouncer"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// The fence race (TestNoStaleEnqueueUnderConcurrentTakeovers) with the
// issuer and the outbox client on a pool through PgBouncer in
// transaction-pooling mode, pgx in QueryExecModeExec (no server-side
// prepared statements): the grants and the enqueues keep their guarantees
// when every transaction may run on another server connection. The
// history checks read the database directly.
func TestNoStaleEnqueueThroughPgBouncer(t *testing.T) {
	t.Parallel()
	direct := testdb.NewURL(t)
	bouncer := pgbouncer.Start(t, testdb.Server(t), pgbouncer.Options{})
	directPool, err := pgxpool.New(context.Background(), direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(directPool.Close)
	cfg, err := pgxpool.ParseConfig(bouncer.URL(direct))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	lease.RequirePrimary(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	b := bundle{pool: directPool, issuer: lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())), client: c}
	raceWith(t, b, c.Enqueue, 3*time.Second)
}
