package lease

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/internal/fencemetrics"
)

// Option configures an Issuer.
type Option func(*options)

type options struct {
	reg          prometheus.Registerer
	lockTimeout  time.Duration
	failoverJump int64
	schema       string
	principal    string
}

// WithRegisterer registers the issuer's metrics with reg:
//
//   - fencegate_lease_takeovers_total{how}: changes of authority (new
//     epochs), by how: free, after_expiry, released, reacquired,
//     external_advance.
//   - fencegate_lease_renew_margin_seconds: lease time left, by PostgreSQL's
//     clock, when each successful renewal arrived; at or below 0 means the
//     lease had already expired and survived only because nobody took over.
//   - fencegate_stale_epoch_rejections_total{where="renew"}: renewals refused
//     because the epoch was no longer current (shared with the outbox and the
//     adapters, see internal/fencemetrics).
//
// Several issuers (and Keepers) may share one registry: they count into the
// same series. Like prometheus.MustRegister, NewIssuer panics when reg holds
// a different collector under one of these names.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *options) { o.reg = reg }
}

// AsPrincipal names who this issuer grants for: recorded in the grant
// history and, once a rule set is applied (package policy), checked
// against it before the resource's control row is created or locked (a
// *fenceerr.ForbiddenError, nothing granted). WithPrincipal overrides it
// per call. Empty (the default): none, and under a rule set every grant
// is refused (field principal).
func AsPrincipal(name string) Option {
	return func(o *options) { o.principal = name }
}

// WithSchema names the PostgreSQL schema fencegate's tables live in
// (gateway migrate --schema). Default: "fencegate". An invalid name makes
// every call of the issuer fail with an *InvalidError naming "schema".
func WithSchema(name string) Option {
	return func(o *options) { o.schema = name }
}

// WithLockTimeout bounds how long a grant (Acquire, Renew, Release,
// Advance) waits for the resource's control-row lock, by PostgreSQL's
// lock_timeout set for the grant's own transaction (SET LOCAL). A worker
// paused inside outbox.EnqueueTx holds that lock until its transaction
// ends; past d the grant fails with a *BusyError (ErrBusy) instead of
// waiting for it forever. Default DefaultLockTimeout (5s); d <= 0 waits
// without a bound (PostgreSQL's lock_timeout 0). Durations are rounded up
// to whole milliseconds.
func WithLockTimeout(d time.Duration) Option {
	return func(o *options) { o.lockTimeout = d }
}

// WithFailoverEpochJump sets how far the first grant after a failover
// (a promotion: the database's timeline grew) raises every resource's
// epoch, in its own transaction: past anything the old primary can have
// granted that the promoted standby never received. Size it as the grants
// per second of one database at peak × the longest replication lag (in
// seconds) the standby may have when it is promoted × a safety factor (for
// example 2,000/s × 60 s × 8 ≈ 1,000,000, the default
// DefaultFailoverEpochJump). Every issuer of a database should use the
// same value: whichever grant comes first after the promotion applies its
// own. 0 only records the new timeline (for synchronous replication,
// where a promoted standby has every acknowledged grant). n is clamped to
// [0, MaxEpoch]; a raised epoch stops at MaxEpoch (the resource is then
// exhausted). See docs/guarantees.md, "After a failover".
func WithFailoverEpochJump(n int64) Option {
	return func(o *options) { o.failoverJump = min(max(n, 0), MaxEpoch) }
}

type metrics struct {
	takeovers   *prometheus.CounterVec
	renewMargin prometheus.Histogram
	stale       *prometheus.CounterVec
}

// renewMarginBuckets span "already expired" (≤0) to a minute left: a
// healthy Keeper renews with about two thirds of the TTL left.
var renewMarginBuckets = []float64{0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60}

// pauseBuckets cover scheduling jitter (≤1ms) up to pauses that outlast any
// sensible lease.
var pauseBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencegate_lease_takeovers_total",
			Help: "Changes of authority over a resource (new epochs), by how: free, after_expiry, released, reacquired, external_advance.",
		}, []string{"how"}),
		renewMargin: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fencegate_lease_renew_margin_seconds",
			Help:    "Lease time left (PostgreSQL's clock) when a renewal arrived; <= 0: renewed after expiry.",
			Buckets: renewMarginBuckets,
		}),
	}
	m.takeovers = mustRegister(reg, m.takeovers)
	m.renewMargin = mustRegister(reg, m.renewMargin)
	for _, h := range []How{HowFree, HowAfterExpiry, HowReleased, HowReacquired, HowExternalAdvance} {
		m.takeovers.WithLabelValues(string(h))
	}
	m.stale = fencemetrics.StaleRejections(reg)
	return m
}

func newPauseHistogram(reg prometheus.Registerer) (prometheus.Histogram, error) {
	return fencemetrics.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "fencegate_worker_pause_seconds",
		Help: "Keeper pause-detector samples: how much later than scheduled each short tick ran " +
			"(GC, CPU starvation, SIGSTOP, VM freeze). One sample per tick per Keeper.",
		Buckets: pauseBuckets,
	}))
}

func mustRegister[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	c, err := fencemetrics.Register(reg, c)
	if err != nil {
		panic(err)
	}
	return c
}
