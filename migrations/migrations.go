// Package migrations holds fencegate's SQL schema as embedded goose
// migrations and applies them.
//
// Up is safe to run from several processes at once: goose takes a
// PostgreSQL session advisory lock for the duration of the run, so a second
// `gateway migrate` waits for the first and then finds nothing to do. Each
// migration file runs in its own transaction.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// FS returns the embedded migration files.
func FS() embed.FS { return files }

// Applied describes one migration applied by Up.
type Applied struct {
	Version int64  `json:"version"`
	Source  string `json:"source"`
}

// Up applies every pending migration to the database behind pool and returns
// the ones it applied (none when the schema is current).
func Up(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) ([]Applied, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return up(ctx, db, logger)
}

func up(ctx context.Context, db *sql.DB, logger *slog.Logger) ([]Applied, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// The advisory lock serialises concurrent migrators; without it two
	// `gateway migrate` could both see version N and both try to apply N+1.
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migrations: create locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithSessionLocker(locker),
		goose.WithTableName("fencegate_schema_version"),
		// A database migrated by a build that lacked a migration numbered
		// below its newest one still gets it: every migration here is
		// written to apply in any order after 00001.
		goose.WithAllowOutofOrder(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: apply: %w", err)
	}
	applied := make([]Applied, 0, len(results))
	for _, r := range results {
		applied = append(applied, Applied{Version: r.Source.Version, Source: r.Source.Path})
		logger.Info("migrations: applied", "version", r.Source.Version, "source", r.Source.Path, "duration", r.Duration)
	}
	return applied, nil
}

// Version reports the schema version currently applied.
func Version(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithTableName("fencegate_schema_version"))
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	return p.GetDBVersion(ctx)
}
