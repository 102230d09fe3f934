package adapters

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
}

func newRuntimeMetrics(reg prometheus.Registerer) (*runtimeMetrics, error) {
	m := &runtimeMetrics{
		stale: fencemetrics.StaleRejections(reg),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencegate_adapter_outcomes_total",
			Help: "Intents handled by the adapter runtime, by kind and outcome.",
		}, []string{"kind", "outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencegate_adapter_errors_total",
			Help: "Messages left unsettled by an internal error (database down, …), by kind.",
		}, []string{"kind"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fencegate_adapter_execute_seconds",
			Help:    "Duration of executor calls, by kind.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"kind"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.outcomes, m.errors, m.duration} {
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
