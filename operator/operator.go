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
// schema that is not a valid name is a *fenceerr.InvalidError naming the
// field schema.
func New(pool *pgxpool.Pool, schema string) (*Operator, error) {
	sch, err := pgschema.Parse(schema)
	if err != nil {
		return nil, inputErr("schema", "%s", strings.TrimPrefix(err.Error(), "schema: "))
	}
	return &Operator{pool: pool, sch: sch, q: pool, issuer: lease.NewIssuer(pool, lease.WithSchema(schema))}, nil
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
