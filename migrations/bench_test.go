package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testdb"
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
