package operator

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/lease"
)

// Querier is what the reads need from a pool or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Operator reads and acts on the intents and resources of one schema. It
// is safe for concurrent use.
type Operator struct {
	pool *pgxpool.Pool
	sch  pgschema.Schema
	// q runs the reads: the pool, or a caller's transaction (ReadingFrom).
	q Querier
	// issuer reads the epoch grants (Epochs).
	issuer *lease.Issuer
}

// New returns an Operator over pool, which must point at the primary (the
// actions write), for the tables in schema ("" is the default schema). A
// nil pool, or a schema that is not a valid name, is a
// *fenceerr.InvalidError naming it (pool, schema). An Operator that only
// reads, on a transaction of the caller's, is NewReader's.
func New(pool *pgxpool.Pool, schema string) (*Operator, error) {
	if pool == nil {
		return nil, inputErr("pool", "must not be nil (an Operator that only reads, on a transaction of yours, is NewReader's)")
	}
	sch, err := parseSchema(schema)
	if err != nil {
		return nil, err
	}
	return &Operator{pool: pool, sch: sch, q: pool, issuer: lease.NewIssuer(pool, lease.WithSchema(schema))}, nil
}

// NewReader returns an Operator whose reads (List, Get, History,
// Resource, …) run on q, a pool or a transaction, for the tables in
// schema, and that has no pool to act with: its Apply, Bulk and Epochs
// return a *fenceerr.InvalidError naming pool. A nil q, or a schema that
// is not a valid name, is a *fenceerr.InvalidError naming it (q, schema).
func NewReader(q Querier, schema string) (*Operator, error) {
	if q == nil {
		return nil, inputErr("q", "must not be nil")
	}
	sch, err := parseSchema(schema)
	if err != nil {
		return nil, err
	}
	return &Operator{sch: sch, q: q, issuer: lease.NewIssuer(nil, lease.WithSchema(schema))}, nil
}

// parseSchema checks schema, naming the field schema.
func parseSchema(schema string) (pgschema.Schema, error) {
	sch, err := pgschema.Parse(schema)
	if err != nil {
		return sch, inputErr("schema", "%s", strings.TrimPrefix(err.Error(), "schema: "))
	}
	return sch, nil
}

// actor is the refusal of an action by an Operator without a pool
// (NewReader's): nil when it has one.
func (o *Operator) actor() error {
	if o.pool == nil {
		return inputErr("pool", "this Operator has none: it only reads (NewReader); make one with New to act")
	}
	return nil
}

// ReadingFrom returns an Operator whose reads (List, Get, History,
// Resource) run on q, a transaction for instance, so that they see what q
// sees. Its actions still run on the pool, each in a transaction of its
// own: an action's durability and lock order do not depend on q.
func (o *Operator) ReadingFrom(q Querier) *Operator {
	c := *o
	c.q = q
	return &c
}

func inputErr(field, format string, args ...any) error {
	return &fenceerr.InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// checkText refuses a filter's text PostgreSQL cannot take: a NUL, or
// bytes that are not UTF-8. Sent as a query argument it fails on the
// server with an encoding error (SQLSTATE 22021), which is no answer for
// bad input; checked here, it names the field. The first bad field of
// fields (name, value pairs) is named.
func checkText(fields ...string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if v := fields[i+1]; !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return inputErr(fields[i], "must be valid UTF-8 without NUL characters")
		}
	}
	return nil
}
