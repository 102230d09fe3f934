package migrations

import (
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/internal/pgschema"
)

// Versions is how an installed schema's versioned migrations compare with
// this build's.
type Versions struct {
	// Pending are this build's migrations not applied in the schema:
	// `gateway migrate` with this build applies them. A process of this
	// build must not run against it (its statements and functions may
	// need them).
	Pending []int64
	// Unknown are migrations applied in the schema that this build does
	// not have: a newer build migrated it. This build's migrate must not
	// run (its function files would replace the newer build's
	// definitions with older ones); its other commands may work, and
	// fail where the newer schema changed what they use.
	Unknown []int64
}

// Behind says what to do about Pending migrations of schema (empty for the
// default), for a process or command of this build that meets them.
func (v Versions) Behind(schema string) string {
	schema = cmp.Or(schema, pgschema.Default)
	return fmt.Sprintf("schema %s lacks migrations %v of this build (its newest is %d): run gateway migrate --schema %s with this build first",
		schema, v.Pending, Latest(), schema)
}

// Latest is the newest versioned migration of this build.
func Latest() int64 { return slices.Max(buildVersions()) }

// buildVersions are the versions of this build's migration files
// (NNNNN_name.sql).
func buildVersions() []int64 {
	names, _ := fs.Glob(files, "*.sql")
	var vs []int64
	for _, n := range names {
		if v, err := strconv.ParseInt(strings.SplitN(n, "_", 2)[0], 10, 64); err == nil {
			vs = append(vs, v)
		}
	}
	return vs
}

// Compare reads which versioned migrations are applied in schema and
// compares them with this build's. The schema must hold an install
// (Installed).
func Compare(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, schema string) (Versions, error) {
	s, err := pgschema.Parse(schema)
	if err != nil {
		return Versions{}, fmt.Errorf("migrations: %w", err)
	}
	return compare(ctx, q, s)
}

func compare(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, s pgschema.Schema) (Versions, error) {
	// goose's table: a row per applied migration (and a row 0 for the
	// table's creation); goose v3 deletes a migration's row when it is
	// undone. A version with a row whose is_applied is true counts.
	rows, err := q.Query(ctx, `SELECT version_id FROM `+s.Qualify(versionTable)+`
		GROUP BY version_id HAVING bool_or(is_applied) AND version_id > 0`)
	if err != nil {
		return Versions{}, fmt.Errorf("migrations: read the applied versions: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return Versions{}, fmt.Errorf("migrations: read the applied versions: %w", err)
	}
	build := buildVersions()
	var v Versions
	for _, b := range build {
		if !slices.Contains(applied, b) {
			v.Pending = append(v.Pending, b)
		}
	}
	for _, a := range applied {
		if !slices.Contains(build, a) {
			v.Unknown = append(v.Unknown, a)
		}
	}
	slices.Sort(v.Pending)
	slices.Sort(v.Unknown)
	return v, nil
}
