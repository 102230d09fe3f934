package pgbouncer_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/pgbouncer"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// hammer runs 8 clients × 200 parameterised queries (a few distinct
// statements each) through pool, counts the answers and returns the first
// error.
func hammer(t *testing.T, pool *pgxpool.Pool) (int, error) {
	t.Helper()
	var (
		mu    sync.Mutex
		ok    int
		first error
		wg    sync.WaitGroup
	)
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				var n int
				err := pool.QueryRow(context.Background(), `SELECT $1::int + `+string(rune('1'+i%5)), w).Scan(&n)
				mu.Lock()
				if err == nil {
					ok++
				} else if first == nil {
					first = err
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return ok, first
}

func poolWith(t *testing.T, url string, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.DefaultQueryExecMode = mode
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// The bouncer pools by transaction: pgx's default mode (server-side
// prepared statements cached per connection) breaks through it, as it does
// through a production PgBouncer before 1.21, while QueryExecModeExec
// works. Without this the tests that run fencegate through it would prove
// nothing.
func TestTransactionPooling(t *testing.T) {
	t.Parallel()
	direct := testdb.NewURL(t)
	b := pgbouncer.Start(t, testdb.Server(t), pgbouncer.Options{PoolSize: 2})
	through := b.URL(direct)

	n, err := hammer(t, poolWith(t, through, pgx.QueryExecModeExec))
	if err != nil || n != 1600 {
		t.Fatalf("exec mode through the bouncer: %d of 1600 answered, error %v", n, err)
	}
	t.Logf("exec mode: %d queries answered", n)

	n, err = hammer(t, poolWith(t, through, pgx.QueryExecModeCacheStatement))
	if err == nil {
		t.Fatalf("cache_statement mode through the bouncer: all %d queries answered; the bouncer does not pool by transaction", n)
	}
	if !strings.Contains(err.Error(), "prepared statement") {
		t.Fatalf("cache_statement mode through the bouncer failed, but not on a prepared statement: %v", err)
	}
	t.Logf("cache_statement mode: %d answered before %v", n, err)
}
