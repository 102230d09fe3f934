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
)

// AsForbidden returns err as a *fenceerr.ForbiddenError when it is a
// refusal of the rule set (SQLSTATE ZF006 or ZF007), else err itself.
func AsForbidden(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || (pe.Code != SQLStateNoPrincipal && pe.Code != SQLStateForbidden) {
		return err
	}
	var detail struct {
		Principal string `json:"principal"`
	}
	_ = json.Unmarshal([]byte(pe.Detail), &detail)
	return &fenceerr.ForbiddenError{Principal: detail.Principal, Field: pe.ColumnName,
		Message: strings.TrimPrefix(pe.Message, "forbidden: "), Err: err}
}
