package gateway

import (
	"context"
	"log/slog"
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
