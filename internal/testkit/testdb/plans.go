package testdb

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TxStatements is a pgx tracer (pgx.ConnConfig.Tracer) that keeps the
// statements run inside the transactions begun by a BEGIN text that starts
// with Begin, up to their COMMIT or ROLLBACK: each text once, with the
// arguments of its first run. Tests use it to check the plans of the
// statements a component really runs in a transaction of its settings.
type TxStatements struct {
	Begin string

	mu   sync.Mutex
	in   map[*pgx.Conn]bool
	args map[string][]any
}

func (s *TxStatements) note(conn *pgx.Conn, sql string, args []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.in == nil {
		s.in, s.args = map[*pgx.Conn]bool{}, map[string][]any{}
	}
	switch low := strings.TrimSpace(strings.ToLower(sql)); {
	case strings.HasPrefix(sql, s.Begin):
		s.in[conn] = true
	case low == "commit" || low == "rollback":
		s.in[conn] = false
	case s.in[conn]:
		if _, ok := s.args[sql]; !ok {
			s.args[sql] = args
		}
	}
}

// Statements returns the statements seen, sorted.
func (s *TxStatements) Statements() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.args))
}

// Args returns the arguments of sql's first run.
func (s *TxStatements) Args(sql string) []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.args[sql]
}

// TraceQueryStart notes a statement (pgx.QueryTracer).
func (s *TxStatements) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.note(conn, d.SQL, d.Args)
	return ctx
}

// TraceQueryEnd does nothing (pgx.QueryTracer).
func (s *TxStatements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart does nothing (pgx.BatchTracer).
func (s *TxStatements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery notes a statement of a batch (pgx.BatchTracer).
func (s *TxStatements) TraceBatchQuery(_ context.Context, conn *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.note(conn, d.SQL, d.Args)
}

// TraceBatchEnd does nothing (pgx.BatchTracer).
func (s *TxStatements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// PreparedPlan prepares stmt (as it was run: its schema already in it) on
// a connection of pool inside a transaction begun by begin, explains its
// execution with the SQL literals lits (nil: NULL for every parameter),
// rolls the transaction back and returns the plan; the test fails unless
// PostgreSQL made a generic plan and no custom one (a plan kept for every
// run, as the component's would be in that transaction's settings).
func PreparedPlan(t testing.TB, pool *pgxpool.Pool, begin, stmt string, lits []string) string {
	t.Helper()
	ctx := context.Background()
	q, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Release()
	name := fmt.Sprintf("testdb_plan_%d", planSeq.Add(1))
	if _, err := q.Exec(ctx, begin); err != nil {
		t.Fatal(err)
	}
	defer q.Exec(ctx, "ROLLBACK")
	if _, err := q.Exec(ctx, "PREPARE "+name+" AS "+stmt); err != nil {
		t.Fatalf("PREPARE %s: %v", stmt, err)
	}
	if lits == nil {
		var params int
		if err := q.QueryRow(ctx, `SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = $1`, name).Scan(&params); err != nil {
			t.Fatal(err)
		}
		lits = slices.Repeat([]string{"NULL"}, params)
	}
	rows, err := q.Query(ctx, "EXPLAIN (COSTS OFF) EXECUTE "+name+"("+strings.Join(lits, ", ")+")")
	if err != nil {
		t.Fatalf("EXPLAIN EXECUTE %s: %v", stmt, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	var generic, custom int64
	if err := q.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1`, name).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if custom > 0 || generic == 0 {
		t.Errorf("planned as a custom plan (generic %d, custom %d): planned again for every run, on the statistics of the moment:\n%s\n%s", generic, custom, stmt, plan)
	}
	return plan
}

var planSeq atomic.Int64

// NewTracedPool returns a pool over a new migrated database (NewURL) whose
// connections report their statements to tracer; it is closed when the
// test ends.
func NewTracedPool(t testing.TB, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
