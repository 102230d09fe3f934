package executor

import (
	"github.com/fencegate/fencegate/internal/fencemetrics"
	"github.com/fencegate/fencegate/outbox"

	"github.com/prometheus/client_golang/prometheus"
)

// outcomeLabels are the values of fencegate_adapter_outcomes_total's
// outcome label: the statuses an Execute records, then the runtime's other
// ends of a delivery. TestOutcomeLabelsListEveryOutcome checks that the
// runtime counts no other.
var outcomeLabels = []string{
	string(outbox.StatusSucceeded), string(outbox.StatusSuperseded), string(outbox.StatusFailed), string(outbox.StatusUnknown),
	"retry", "retry_key_kept", "busy", "conflict", "done_before", "already_terminal", "not_due",
	"held_by_lookup", "recovered_by_lookup", "waiting_for_proof", "adapter_panic", "adapter_bad_outcome",
}

// lookupResults are the values of fencegate_adapter_lookups_total's
// result label (lookupResult).
var lookupResults = []string{"found", "not_found", "error"}

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

// newRuntimeMetrics makes the runtime's metrics, registered with reg (nil:
// none), with every counter's series of every kind in kinds at 0: a
// series that appears only when it first counts reads 1 in its first
// sample, and increase() and rate() over it see nothing until it counts
// again — the first effect after lost ownership of a process, its first
// failed intent, would never alert.
func newRuntimeMetrics(reg prometheus.Registerer, kinds []string) (*runtimeMetrics, error) {
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
	// Registered again (a second runtime on one registry): the registered
	// vectors are the ones counted into, and initialised, not fresh ones
	// that nothing exports.
	for _, v := range []**prometheus.CounterVec{&m.outcomes, &m.errors, &m.lostOwnership, &m.notRecorded, &m.foreign, &m.lookups} {
		c, err := fencemetrics.Register(reg, *v)
		if err != nil {
			return nil, err
		}
		*v = c
	}
	for _, v := range []**prometheus.HistogramVec{&m.duration, &m.settle} {
		h, err := fencemetrics.Register(reg, *v)
		if err != nil {
			return nil, err
		}
		*v = h
	}
	for _, kind := range kinds {
		for _, o := range outcomeLabels {
			m.outcomes.WithLabelValues(kind, o)
		}
		for _, res := range lookupResults {
			m.lookups.WithLabelValues(kind, res)
		}
		for _, v := range []*prometheus.CounterVec{m.errors, m.lostOwnership, m.notRecorded, m.foreign} {
			v.WithLabelValues(kind)
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
