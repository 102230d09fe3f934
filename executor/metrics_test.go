package executor_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/internal/testkit/metricstest"
)

// Every counter of the runtime has its series of every kind it runs at 0
// as soon as the runtime is made, before anything is counted: a series
// that appears only when it first counts reads 1 in its first sample,
// so increase() and rate() over it miss that first event — the alert on
// an effect after lost ownership never fired on a process's first one,
// nor the failed-rate alert on a kind's first failures.
func TestCountersStartAtZero(t *testing.T) {
	t.Parallel()
	e := adaptertest.NewEnv(t, adaptertest.Options{Kinds: testKinds})
	reg := prometheus.NewRegistry()
	d := &destination{effects: map[string]int{}}
	kinds := []string{"test", "other"}
	if _, err := executor.NewRuntime(e.Pool, e.NC, e.Store, e.Client, executor.Config{Registerer: reg,
		Executors: []adapters.Executor{testExec{d}, kindExec{testExec{d}, "other"}}}); err != nil {
		t.Fatal(err)
	}
	outcomes := []string{"succeeded", "failed", "unknown", "superseded", "retry", "retry_key_kept", "busy", "conflict", "done_before",
		"already_terminal", "not_due", "held_by_lookup", "recovered_by_lookup", "waiting_for_proof", "adapter_panic", "adapter_bad_outcome"}
	for _, kind := range kinds {
		want := []map[string]string{}
		for _, name := range []string{"fencegate_effect_after_lost_ownership_total", "fencegate_adapter_errors_total",
			"fencegate_adapter_outcome_not_recorded_total", "fencegate_adapter_foreign_messages_total"} {
			want = append(want, map[string]string{"__name__": name, "kind": kind})
		}
		for _, o := range outcomes {
			want = append(want, map[string]string{"__name__": "fencegate_adapter_outcomes_total", "kind": kind, "outcome": o})
		}
		for _, r := range []string{"found", "not_found", "error"} {
			want = append(want, map[string]string{"__name__": "fencegate_adapter_lookups_total", "kind": kind, "result": r})
		}
		for _, w := range want {
			name := w["__name__"]
			delete(w, "__name__")
			m := metricstest.Find(t, reg, name, w)
			if m == nil || len(m.GetLabel()) != len(w) {
				t.Errorf("no series %s %v after the runtime was made", name, w)
				continue
			}
			if v := metricstest.Value(m); v != 0 {
				t.Errorf("%s %v = %v, want 0", name, w, v)
			}
		}
	}
}
