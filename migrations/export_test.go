package migrations

import (
	"context"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/pgschema"
)

// UpVersioned leaves schema as a build without function files left it:
// the versioned migrations up to version (0: all of them) and the
// functions' search_path pinned, nothing of the function files.
func UpVersioned(ctx context.Context, pool *pgxpool.Pool, schema string, version int64) error {
	s, err := pgschema.Parse(schema)
	if err != nil {
		return err
	}
	if err := prepareSchema(ctx, pool, s, false); err != nil {
		return err
	}
	if _, err := migrate(ctx, pool, s, version, nil, slog.New(slog.DiscardHandler)); err != nil {
		return err
	}
	return PinFunctions(ctx, pool, s.Name())
}

// WithFunctions is cfg applying the function files of fsys instead of the
// embedded ones.
func WithFunctions(cfg Config, fsys fs.FS) Config {
	cfg.functions = fsys
	return cfg
}

// FunctionsDir is the folder of the function files in FS.
const FunctionsDir = functionsDir
