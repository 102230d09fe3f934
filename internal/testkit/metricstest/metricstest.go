// Package metricstest reads metrics back from a Prometheus registry in
// tests: the series of a metric whose labels match, and its value.
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Find returns the first series of metric name whose labels include every
// pair of labels (any series when labels is empty), or nil when there is
// none.
func Find(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			return m
		}
	}
	return nil
}

// Get is Find, failing the test when there is no such series.
func Get(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	m := Find(t, g, name, labels)
	if m == nil {
		t.Fatalf("no series %s%v gathered", name, labels)
	}
	return m
}

// Value is a counter's or gauge's value (0 for a nil series: a counter
// never incremented has none).
func Value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}
