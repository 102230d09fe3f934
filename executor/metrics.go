package executor

import (
	"errors"

	"github.com/fencegate/fencegate/internal/fencemetrics"

	"github.com/prometheus/client_golang/prometheus"
)

type runtimeMetrics struct {
	stale    *prometheus.CounterVec
	outcomes *prometheus.CounterVec
	errors   *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// lostOwnership counts effects that completed after their attempt lost
	// its idempotency key (see the runtime's complete).
	lostOwnership *prometheus.CounterVec
	// notRecorded counts outcomes that could not be recorded on an intent
	// that already had a final status (they are in its history).
	notRecorded *prometheus.CounterVec
	// settle is commit → outcome recorded; lookups counts result lookups
	// by result (found, not_found, error).
	settle  *prometheus.HistogramVec
	lookups *prometheus.CounterVec
	// foreign counts messages of another namespace, terminated unexecuted.
	foreign *prometheus.CounterVec
}

func newRuntimeMetrics(reg prometheus.Registerer) (*runtimeMetrics, error) {
	m := &runtimeMetrics{
		stale:         fencemetrics.StaleRejections(reg),
		outcomes:      counterVec(prometheus.CounterOpts{Name: "fencegate_adapter_outcomes_total", Help: "Intents handled by the adapter runtime, by kind and outcome."}, "outcome"),
		errors:        counterVec(prometheus.CounterOpts{Name: "fencegate_adapter_errors_total", Help: "Messages left unsettled by an internal error (database down, …), by kind."}),
		duration:      histogramVec(prometheus.HistogramOpts{Name: "fencegate_adapter_execute_seconds", Help: "Duration of executor calls, by kind."}, 16),
		lostOwnership: counterVec(prometheus.CounterOpts{Name: "fencegate_effect_after_lost_ownership_total", Help: "Effects that completed after their attempt had lost its idempotency key (taken over): possible duplicates where the destination cannot dedup, by kind."}),
		notRecorded:   counterVec(prometheus.CounterOpts{Name: "fencegate_adapter_outcome_not_recorded_total", Help: "Outcomes not recorded on an intent because it already had a final status (cancelled meanwhile, or recorded by another path first); each is in the intent's history. By kind."}),
		settle:        histogramVec(prometheus.HistogramOpts{Name: "fencegate_adapter_settle_seconds", Help: "From an intent's commit to its outcome recorded by the adapter runtime, by kind."}, 20),
		lookups:       counterVec(prometheus.CounterOpts{Name: "fencegate_adapter_lookups_total", Help: "Result lookups after an outcome was lost, by kind and result (found, not_found, error)."}, "result"),
		foreign:       counterVec(prometheus.CounterOpts{Name: "fencegate_adapter_foreign_messages_total", Help: "Messages refused because they carried another deployment's namespace (or none): terminated, never executed. By kind."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.outcomes, m.errors, m.duration, m.lostOwnership, m.notRecorded, m.foreign, m.settle, m.lookups} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, err
				}
			}
		}
	}
	return m, nil
}

// lookupResult is a lookup's label: found, not_found or error.
func lookupResult(found bool, err error) string {
	switch {
	case err != nil:
		return "error"
	case found:
		return "found"
	}
	return "not_found"
}

// counterVec is a runtime counter labelled by kind, then by labels.
func counterVec(opts prometheus.CounterOpts, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(opts, append([]string{"kind"}, labels...))
}

// histogramVec is a runtime histogram of seconds labelled by kind, its
// buckets doubling from a millisecond.
func histogramVec(opts prometheus.HistogramOpts, buckets int) *prometheus.HistogramVec {
	opts.Buckets = prometheus.ExponentialBuckets(0.001, 2, buckets)
	return prometheus.NewHistogramVec(opts, []string{"kind"})
}
