package dispatcher

import "github.com/prometheus/client_golang/prometheus"

// metrics are the dispatcher's Prometheus metrics.
type metrics struct {
	claimed       prometheus.Counter
	published     prometheus.Counter
	rerelayed     prometheus.Counter
	publishErrors prometheus.Counter
	claimsLost    prometheus.Counter
	latency       prometheus.Histogram
	backlog       prometheus.Gauge
	held          prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "fencegate", "dispatcher"
	m := &metrics{
		claimed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "claimed_total", Help: "Intents claimed for relay."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "published_total", Help: "Intents published and acknowledged by JetStream (first relays and re-relays)."}),
		rerelayed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "rerelayed_total", Help: "Intents published again after the relay timeout passed without an outcome."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "publish_errors_total", Help: "Publishes that failed or got no PubAck in time; their claims were returned."}),
		claimsLost: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "claims_lost_total", Help: "Acknowledged publishes that could not be marked relayed (the mark failed): their intents are published again under the same message ids."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name:    "relay_latency_seconds",
			Help:    "Time from an intent's commit (created_at) to the PubAck of its first relay (re-relays and retried intents are not timed).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14)}),
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "pending_intents", Help: "Intents waiting to be relayed (status pending), sampled."}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "rerelay_held_kinds", Help: "Kinds whose re-relays wait because their adapters' consumers still hold undelivered or unacknowledged messages, sampled at most once a second."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.claimed, m.published, m.rerelayed, m.publishErrors, m.claimsLost, m.latency, m.backlog, m.held} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
