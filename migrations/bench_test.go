package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// BenchmarkPinnedSearchPath measures what pinning a function's search_path
// (migrations.Up, PinFunctions: SET search_path on every function of the
// schema) costs a call, on the server: the same PL/pgSQL body (a read of
// one control row by primary key, as fencegate_enqueue's lock does) with
// and without the setting, called 2,000 times in one statement, each
// alternately. It reports the difference per call ("µs/pin") next to the
// call itself ("µs/call").
func BenchmarkPinnedSearchPath(b *testing.B) {
	pool := testdb.New(b)
	ctx := context.Background()
	s := testdb.Schema()
	if _, err := pool.Exec(ctx, testdb.SQL(`
		INSERT INTO fencegate.resources (resource_id, epoch) VALUES ('bench', 1);
		CREATE FUNCTION fencegate.bench_plain(p text) RETURNS bigint LANGUAGE plpgsql AS $$
		DECLARE e bigint;
		BEGIN SELECT r.epoch INTO e FROM fencegate.resources r WHERE r.resource_id = p; RETURN e; END $$;
		CREATE FUNCTION fencegate.bench_pinned(p text) RETURNS bigint LANGUAGE plpgsql SET search_path = `+s+`, pg_temp AS $$
		DECLARE e bigint;
		BEGIN SELECT r.epoch INTO e FROM fencegate.resources r WHERE r.resource_id = p; RETURN e; END $$;`)); err != nil {
		b.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	const n = 2000
	run := func(fn string) time.Duration {
		start := time.Now()
		if _, err := conn.Exec(ctx, testdb.SQL(`SELECT count(fencegate.`+fn+`('bench')) FROM generate_series(1, 2000)`)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	run("bench_plain")
	run("bench_pinned")
	var plain, pinned time.Duration
	for b.Loop() {
		plain += run("bench_plain")
		pinned += run("bench_pinned")
	}
	b.ReportMetric(float64(plain.Microseconds())/float64(b.N*n), "µs/call")
	b.ReportMetric(float64((pinned-plain).Microseconds())/float64(b.N*n), "µs/pin")
}

// BenchmarkSQLInterfaceEnqueue compares the SQL interface's enqueue
// (fencegate.enqueue: its checks in PL/pgSQL, then fencegate_enqueue) with
// the Go client's (outbox.Client.Enqueue: its checks in Go, then
// fencegate_enqueue), each an email intent in a transaction of its own,
// on one connection each, 200 at a time, alternately. It reports the
// microseconds an enqueue takes through each ("µs/sql", "µs/go") and their
// ratio ("sql/go").
func BenchmarkSQLInterfaceEnqueue(b *testing.B) {
	pool := testdb.New(b)
	ctx := context.Background()
	iss := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()))
	l, err := iss.Acquire(ctx, "bench", "b", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema(), NotifyWindow: -1})
	if err != nil {
		b.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	const n = 200
	seq := 0
	viaSQL := func() time.Duration {
		start := time.Now()
		for range n {
			seq++
			if _, err := sqlEnqueue(ctx, conn, enqueueArgs{resource: "bench", epoch: l.Epoch, operation: fmt.Sprintf("op-%d", seq), kind: "email", payload: mail}); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	viaGo := func() time.Duration {
		start := time.Now()
		for range n {
			seq++
			if _, err := ob.Enqueue(ctx, outbox.Intent{Resource: "bench", Epoch: l.Epoch, OperationID: fmt.Sprintf("op-%d", seq), Kind: "email", Payload: json.RawMessage(mail)}); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	viaSQL()
	viaGo()
	var s, g time.Duration
	for b.Loop() {
		s += viaSQL()
		g += viaGo()
	}
	b.ReportMetric(float64(s.Microseconds())/float64(b.N*n), "µs/sql")
	b.ReportMetric(float64(g.Microseconds())/float64(b.N*n), "µs/go")
	b.ReportMetric(float64(s)/float64(g), "sql/go")
}
