package cli

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/pgschema"
)

// A CLI worker (gateway enqueue, lease, epoch advance in a shell script)
// has no /metrics: its refusals and grants are counted in the database
// (fencegate_count, migrations/00024), where the relay's processes export
// them as fencegate_fence_refusals_total{path="cli"} and
// fencegate_worker_lease_takeovers_total{path="cli"}. The CLI's own
// issuer and outbox client count into no registry, so nothing is counted
// twice. Counting is best effort: a count that cannot be written (a role
// without the right, the database gone) changes neither the command's
// answer nor its exit code.

// countTimeout bounds a count: the command's answer is ready.
const countTimeout = 2 * time.Second

// countRefusal counts err in the database when it is a fence refusal
// (stale_epoch, lease_held, forbidden). The refused transaction has
// rolled back already; the count is a statement of its own.
func (a *app) countRefusal(ctx context.Context, pool *pgxpool.Pool, err error) {
	switch c := errmap.Map(err).Code; c {
	case errmap.StaleEpoch, errmap.LeaseHeld, errmap.Forbidden:
		a.count(ctx, pool, "cli_"+string(c))
	}
}

// countGrant counts the grant of epoch on resource by how it was made,
// read from the grant history (lease.Issuer records it in the grant's
// transaction).
func (a *app) countGrant(ctx context.Context, pool *pgxpool.Pool, resource string, epoch int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), countTimeout)
	defer cancel()
	sch := pgschema.MustParse(a.schema())
	_, _ = pool.Exec(ctx, sch.SQL(`SELECT fencegate.fencegate_count('cli_takeover_' || how) FROM fencegate.epoch_grants
		WHERE resource_id = $1 AND epoch = $2 AND how IN ('free', 'after_expiry', 'released', 'reacquired', 'external_advance')`), resource, epoch)
}

func (a *app) count(ctx context.Context, pool *pgxpool.Pool, name string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), countTimeout)
	defer cancel()
	_, _ = pool.Exec(ctx, pgschema.MustParse(a.schema()).SQL(`SELECT fencegate.fencegate_count($1)`), name)
}
