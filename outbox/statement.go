package outbox

import (
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/internal/durable"
)

// The enqueue statements: one call of fencegate_enqueue (or
// fencegate_enqueue_batch) with its eight parameters, each in up to four
// forms, as transaction-local settings are made before the call:
//
//   - as: the trace context (TraceContextSetting) and principal
//     (PrincipalSetting) the intent records and the rule set's check
//     reads; a batch, which stores no trace context, sets the principal
//     only;
//   - bounded: PostgreSQL's lock_timeout, the client's LockTimeout, in the
//     client's own transactions only (a statement run on the pool is its
//     own transaction, so the setting ends with it; in a caller's
//     transaction it would outlive the call, so EnqueueTx never sends it).
//
// The settings' values are the parameters after $8, in that order. Each
// form is one statement, so a setting costs no round trip: set_config runs
// in a MATERIALIZED CTE, and the call takes the CTE's values in its last
// argument (the notify flag, AND-ed with "set"), so PostgreSQL evaluates
// the settings before the function runs — the insert inside reads the
// principal, and the lock waits inside run under the bound.
var (
	enqueueStatements      [2][2]string // [as][bounded]
	enqueueBatchStatements [2][2]string
)

func init() {
	const one = "outcome, intent_id, status, current_epoch, existing_epoch"
	const batch = "ord, outcome, intent_id, status, current_epoch"
	for as := range 2 {
		for bounded := range 2 {
			var single, many []string
			if as == 1 {
				single = append(single, TraceContextSetting, PrincipalSetting)
				many = append(many, PrincipalSetting)
			}
			if bounded == 1 {
				single = append(single, "lock_timeout")
				many = append(many, "lock_timeout")
			}
			enqueueStatements[as][bounded] = callSQL(one, "fencegate_enqueue", single)
			enqueueBatchStatements[as][bounded] = callSQL(batch, "fencegate_enqueue_batch", many)
		}
	}
}

// callSQL is the statement selecting cols from fn($1, …, $8) after setting
// each of settings, for the transaction, to $9, $10, … in turn.
func callSQL(cols, fn string, settings []string) string {
	call := "fencegate." + fn + "($1, $2, $3, $4, $5, $6, $7, $8"
	if len(settings) == 0 {
		return "SELECT " + cols + " FROM " + call + ") WHERE " + durable.Where
	}
	sets := make([]string, len(settings))
	deps := make([]string, len(settings))
	for i, name := range settings {
		col := "s" + strconv.Itoa(i)
		sets[i] = "set_config('" + name + "', $" + strconv.Itoa(9+i) + ", true) AS " + col
		deps[i] = " AND s." + col + " IS NOT NULL"
	}
	return "WITH s AS MATERIALIZED (SELECT " + strings.Join(sets, ", ") + ")\n\tSELECT " + cols +
		"\n\tFROM s, LATERAL " + call + strings.Join(deps, "") + ") e\n\tWHERE " + durable.Where
}

// lockTimeoutSetting is d as lock_timeout's value: whole milliseconds,
// rounded up, so that a positive bound never becomes 0, which PostgreSQL
// reads as "wait forever".
func lockTimeoutSetting(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10)
}
