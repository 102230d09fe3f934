package policy

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencegate/fencegate/fenceerr"
)

// SQLSTATEs of the rule set's refusals (migrations/functions/policy.sql).
const (
	// SQLStateNoPrincipal: the caller acts as no principal of the rule set
	// in force (an unmapped SQL role, or a Go caller naming none).
	SQLStateNoPrincipal = "ZF006"
	// SQLStateForbidden: the principal may not do what was asked.
	SQLStateForbidden = "ZF007"
	// SQLStateInvalid: invalid input, the field in the error's COLUMN.
	SQLStateInvalid = "ZF004"
)

// Refusal returns err as the rule set's refusal it is: a
// *fenceerr.ForbiddenError for SQLSTATE ZF006 or ZF007, a
// *fenceerr.InvalidError naming the field for ZF004 (a destination the
// rule set does not allow, a key too long once scoped); else err itself.
// The PostgreSQL error stays in the chain.
func Refusal(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case SQLStateNoPrincipal, SQLStateForbidden:
		var detail struct {
			Principal string `json:"principal"`
		}
		_ = json.Unmarshal([]byte(pe.Detail), &detail)
		return &fenceerr.ForbiddenError{Principal: detail.Principal, Field: pe.ColumnName,
			Message: strings.TrimPrefix(pe.Message, "forbidden: "), Err: err}
	case SQLStateInvalid:
		return &invalidError{InvalidError: fenceerr.InvalidError{Field: pe.ColumnName,
			Message: strings.TrimPrefix(pe.Message, pe.ColumnName+": ")}, err: err}
	}
	return err
}

// invalidError is a *fenceerr.InvalidError that keeps the PostgreSQL
// error in its chain.
type invalidError struct {
	fenceerr.InvalidError
	err error
}

func (e *invalidError) Unwrap() []error { return []error{&e.InvalidError, e.err} }
