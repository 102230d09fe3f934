package gateway

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/prometheus/client_golang/prometheus"
)

// intentCollector reports, at each scrape, the intents an operator acts on,
// read from PostgreSQL (the truth, whichever process changed them):
//
//	fencegate_intents{status,kind}                      pending, relayed, failed, unknown
//	fencegate_intent_oldest_age_seconds{status,kind}    age of the oldest of them
//
// Succeeded, superseded and cancelled intents are not counted: they need no
// one, and counting them would read the whole outbox. Each status has a
// partial index (pending, relayed, and the rare ones), so a scrape reads
// only these rows; it is bounded by scrapeTimeout.
type intentCollector struct {
	pool *pgxpool.Pool
	// schema qualifies the query.
	schema pgschema.Schema
	log    *slog.Logger
	count  *prometheus.Desc
	age    *prometheus.Desc
}

const scrapeTimeout = 3 * time.Second

func newIntentCollector(pool *pgxpool.Pool, schema pgschema.Schema, log *slog.Logger) *intentCollector {
	return &intentCollector{pool: pool, schema: schema, log: log,
		count: prometheus.NewDesc("fencegate_intents", "Intents by status and kind, for the statuses an operator watches (pending, relayed, failed, unknown), read from PostgreSQL at each scrape.", []string{"status", "kind"}, nil),
		age:   prometheus.NewDesc("fencegate_intent_oldest_age_seconds", "Age of the oldest intent by status and kind (since created).", []string{"status", "kind"}, nil),
	}
}

func (c *intentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.count
	ch <- c.age
}

func (c *intentCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	rows, err := c.pool.Query(ctx, c.schema.SQL(`SELECT status, kind, count(*), extract(epoch FROM now() - min(created_at))::float8
		FROM fencegate.intents WHERE status IN ('pending', 'relayed', 'failed', 'unknown') GROUP BY status, kind`))
	if err != nil {
		c.log.Warn("gateway: intent metrics: query failed", "component", "gateway", "error", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var status, kind string
		var n int64
		var age float64
		if err := rows.Scan(&status, &kind, &n, &age); err != nil {
			c.log.Warn("gateway: intent metrics", "component", "gateway", "error", err)
			return
		}
		ch <- prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(n), status, kind)
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age, status, kind)
	}
}

// counterCollector reports, at each scrape, the counters PostgreSQL keeps
// for workers outside the gateway's processes (migrations/00024): the SQL
// interface's (path sql) and the CLI's (path cli).
//
//	fencegate_fence_refusals_total{path,reason}          stale_epoch, lease_held, forbidden
//	fencegate_worker_lease_takeovers_total{path,how}     new epochs granted to them
//
// The gateway's own refusals and grants are not among them: its processes
// count those in fencegate_stale_epoch_rejections_total and
// fencegate_lease_takeovers_total, so a refusal is counted once, in one of
// the two. Every relay process reports the same database: alert on max()
// across them, as for fencegate_intents. One read of pg_sequences, bounded
// by scrapeTimeout.
type counterCollector struct {
	pool      *pgxpool.Pool
	schema    pgschema.Schema
	log       *slog.Logger
	refusals  *prometheus.Desc
	takeovers *prometheus.Desc
}

func newCounterCollector(pool *pgxpool.Pool, schema pgschema.Schema, log *slog.Logger) *counterCollector {
	return &counterCollector{pool: pool, schema: schema, log: log,
		refusals: prometheus.NewDesc("fencegate_fence_refusals_total",
			"Refusals of workers outside the gateway's processes, counted in PostgreSQL, by path (sql: the SQL interface; cli: gateway enqueue, lease, epoch) "+
				"and reason (stale_epoch, lease_held, forbidden). The gateway's own stale-epoch refusals are in fencegate_stale_epoch_rejections_total.",
			[]string{"path", "reason"}, nil),
		takeovers: prometheus.NewDesc("fencegate_worker_lease_takeovers_total",
			"New epochs granted to workers outside the gateway's processes, counted in PostgreSQL, by path (sql, cli) and how "+
				"(free, after_expiry, released, reacquired, external_advance). The gateway's own grants are in fencegate_lease_takeovers_total.",
			[]string{"path", "how"}, nil),
	}
}

func (c *counterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.refusals
	ch <- c.takeovers
}

func (c *counterCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	// last_value is NULL before the first nextval (and without the right
	// to read the sequence): a count of 0.
	rows, err := c.pool.Query(ctx, `SELECT sequencename::text, coalesce(last_value, 0) FROM pg_catalog.pg_sequences
		WHERE schemaname = $1 AND starts_with(sequencename::text, 'fence_count_')`, c.schema.Name())
	if err != nil {
		c.log.Warn("gateway: counter metrics: query failed", "component", "gateway", "error", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			c.log.Warn("gateway: counter metrics", "component", "gateway", "error", err)
			return
		}
		path, what, ok := strings.Cut(strings.TrimPrefix(name, "fence_count_"), "_")
		if !ok {
			continue
		}
		if how, ok := strings.CutPrefix(what, "takeover_"); ok {
			ch <- prometheus.MustNewConstMetric(c.takeovers, prometheus.CounterValue, float64(n), path, how)
		} else {
			ch <- prometheus.MustNewConstMetric(c.refusals, prometheus.CounterValue, float64(n), path, what)
		}
	}
}
