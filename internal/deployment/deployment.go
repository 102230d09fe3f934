// Package deployment reads and sets the deployment's identity on NATS: its
// namespace (migration 00018, table deployment; see internal/wire.Namespace
// for what it separates).
package deployment

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/wire"
)

// Info is the recorded identity.
type Info struct {
	Namespace wire.Namespace `json:"namespace"`
	// Explicit: given at migrate (--namespace), else derived from the
	// cluster's system identifier and the database's name.
	Explicit bool `json:"explicit"`
}

// ErrNotMigrated is returned (as a *NotMigratedError) when the deployment
// table does not exist yet.
var ErrNotMigrated = errors.New("deployment: the database has no namespace yet: run gateway migrate")

// NotMigratedError names the schema that is not migrated.
type NotMigratedError struct{ Schema string }

func (e *NotMigratedError) Error() string {
	return fmt.Sprintf("deployment: schema %s of the database is not migrated (no namespace yet): run gateway migrate --schema %s", e.Schema, e.Schema)
}

// Is reports whether target is ErrNotMigrated.
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// Resolve returns the deployment's namespace. A derived one whose database
// changed since it was recorded (another name: a copy made from a template,
// or another system identifier: a dump restored on another cluster) is
// derived again and recorded, in one transaction holding the row, so that a
// copy never keeps its original's namespace and every process that starts
// afterwards reads the same value. Processes already running keep the one
// they read at their start: restart all of a deployment's processes after
// copying or renaming its database.
func Resolve(ctx context.Context, pool *pgxpool.Pool, schema string) (Info, error) {
	var info Info
	sch, err := pgschema.Parse(schema)
	if err != nil {
		return Info{}, err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var ns string
		var rederived bool
		err := tx.QueryRow(ctx, sch.SQL(`
			WITH cur AS (SELECT current_database() AS db, fencegate.fencegate_deployment_sysid() AS sysid),
			old AS (SELECT * FROM fencegate.deployment FOR UPDATE),
			upd AS (
				UPDATE fencegate.deployment d SET namespace = fencegate.fencegate_derived_namespace(),
					database_name = cur.db, system_identifier = cur.sysid, updated_at = now()
				FROM cur, old
				WHERE NOT old.explicit AND (old.database_name <> cur.db
					OR (cur.sysid IS NOT NULL AND old.system_identifier IS DISTINCT FROM cur.sysid))
				RETURNING d.namespace)
			SELECT coalesce((SELECT namespace FROM upd), old.namespace), old.explicit, EXISTS (SELECT 1 FROM upd)
			FROM old`)).Scan(&ns, &info.Explicit, &rederived)
		if err != nil {
			return err
		}
		info.Namespace = wire.Namespace(ns)
		return nil
	})
	if err != nil {
		if pgschema.Missing(err) || errors.Is(err, pgx.ErrNoRows) {
			return Info{}, &NotMigratedError{Schema: sch.Name()}
		}
		return Info{}, fmt.Errorf("deployment: read the namespace: %w", err)
	}
	return info, nil
}

// Set records ns as the deployment's explicit namespace (gateway migrate
// --namespace) and returns the one it replaces. Messages relayed under the
// old one are not consumed under the new: their intents are relayed again
// after the relay timeout (30 s by default) — changing it is safe, only
// slow for what is in flight, but every process must be restarted.
func Set(ctx context.Context, pool *pgxpool.Pool, schema string, ns wire.Namespace) (old wire.Namespace, err error) {
	sch, err := pgschema.Parse(schema)
	if err != nil {
		return "", err
	}
	var prev string
	err = pool.QueryRow(ctx, sch.SQL(`
		WITH old AS (SELECT namespace FROM fencegate.deployment FOR UPDATE)
		UPDATE fencegate.deployment SET namespace = $1, explicit = true, database_name = current_database(),
			system_identifier = fencegate.fencegate_deployment_sysid(), updated_at = now()
		FROM old RETURNING old.namespace`), string(ns)).Scan(&prev)
	if err != nil {
		if pgschema.Missing(err) || errors.Is(err, pgx.ErrNoRows) {
			return "", &NotMigratedError{Schema: sch.Name()}
		}
		return "", fmt.Errorf("deployment: set the namespace: %w", err)
	}
	return wire.Namespace(prev), nil
}
