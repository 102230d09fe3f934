// Package fencemetrics holds the Prometheus metrics that several fencegate
// components share, so each one counts into the same series whichever of
// them registers it first.
//
// The one metric today is fencegate_stale_epoch_rejections_total: every
// place that turns a stale epoch away counts it with its own "where" label,
// so an operator sees on one graph where fenced-out writers are stopped.
package fencemetrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the "where" label of fencegate_stale_epoch_rejections_total.
const (
	// WhereEnqueue: outbox.Enqueue refused an intent (fencegate_enqueue said stale).
	WhereEnqueue = "enqueue"
	// WhereRenew: lease.Issuer.Renew refused a renewal.
	WhereRenew = "renew"
	// WhereExecuteFence: the adapter runtime recorded an execute-fenced
	// intent as superseded instead of executing it.
	WhereExecuteFence = "execute_fence"
	// WhereFileDestination: the file adapter's destination refused to
	// switch the published reference to an older epoch.
	WhereFileDestination = "file_destination"
)

// Wheres lists every value of the "where" label.
var Wheres = []string{WhereEnqueue, WhereRenew, WhereExecuteFence, WhereFileDestination}

// StaleRejectionsName is the full name of the stale-epoch rejection counter.
const StaleRejectionsName = "fencegate_stale_epoch_rejections_total"

// StaleRejections returns the counter of stale-epoch rejections by where
// they happened (label "where", one of Wheres), registered with reg.
//
// It is idempotent: every call with the same reg returns the same counter
// vector, so components can call it independently. With a nil reg it
// returns a fresh, unregistered vector (counting works, nothing is
// exported). Every label value starts at zero, so rate() queries work before
// the first rejection. It panics, like prometheus.MustRegister, only when
// reg already holds a different collector under the same name.
func StaleRejections(reg prometheus.Registerer) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: StaleRejectionsName,
		Help: "Writes and renewals turned away because their epoch was no longer current, by where: enqueue, renew, execute_fence, file_destination.",
	}, []string{"where"})
	v, err := Register(reg, v)
	if err != nil {
		panic(err)
	}
	for _, w := range Wheres {
		v.WithLabelValues(w)
	}
	return v
}

// Register registers c with reg and returns it, or, when an equal collector
// is already registered, returns that one instead, so that constructors can
// be called more than once with the same registry. A nil reg registers
// nothing and returns c.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
		return c, fmt.Errorf("fencemetrics: a collector of another type is registered in its place: %w", err)
	}
	return c, fmt.Errorf("fencemetrics: register: %w", err)
}
