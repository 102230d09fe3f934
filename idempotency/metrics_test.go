package idempotency_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/metricstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// The group commit's failure counter has both ops' series at 0 once the
// store is made: one that appeared at its first failure would read 1 in
// its first sample, and increase() would not see that failure.
func TestGroupFailuresStartAtZero(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := idempotency.New(testdb.New(t), idempotency.Config{Schema: testdb.Schema(), GroupCommit: true, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"begin", "complete"} {
		m := metricstest.Find(t, reg, "fencegate_idempotency_group_failures_total", map[string]string{"op": op})
		if m == nil {
			t.Errorf("no series fencegate_idempotency_group_failures_total{op=%q} after the store was made", op)
		} else if v := metricstest.Value(m); v != 0 {
			t.Errorf("fencegate_idempotency_group_failures_total{op=%q} = %v, want 0", op, v)
		}
	}
}
