package operator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/outbox"
)

// BulkBatch is how many intents a bulk action reads at a time; each is
// then acted on in its own transaction (Apply), so that the locks of one
// intent are never held while another is changed.
const BulkBatch = 500

// BulkPreviewIDs is how many intent ids a dry run lists (BulkResult.IDs):
// enough to recognise what the filter selects, few enough to read.
const BulkPreviewIDs = 20

// BulkRequest is an operator action on every intent a filter selects.
type BulkRequest struct {
	Action Action `json:"action"`
	// Status is required: the status of the intents to act on (one the
	// action applies to: retry failed or unknown, cancel pending, failed
	// or unknown, resolve unknown).
	Status outbox.Status `json:"status"`
	// Kind, Resource (one resource, by its exact name) and ResourcePrefix
	// (every resource whose name starts with it) narrow it.
	Kind           string `json:"kind,omitempty"`
	Resource       string `json:"resource,omitempty"`
	ResourcePrefix string `json:"resource_prefix,omitempty"`
	// Search narrows it as ListFilter.Search does a list (operation id,
	// idempotency key, destination).
	Search string `json:"search,omitempty"`
	// IDs, when given, narrow it to these intents (at most MaxListLimit):
	// the rows a person picked on a list. Those of them the other filters
	// do not select are left alone.
	IDs []int64 `json:"ids,omitempty"`
	// Since and Until bound the intents' last change (updated_at): a
	// duration back from now ("2h") or an RFC 3339 time.
	Since string `json:"since,omitempty"`
	Until string `json:"until,omitempty"`
	// Outcome is resolve's; Note is recorded on every intent.
	Outcome outbox.Status `json:"outcome,omitempty"`
	Note    string        `json:"note,omitempty"`
	// Force (retry only) retries intents whose effect is possible too:
	// the operator accepts a second effect. Without it they are skipped
	// (Skipped["effect_possible"]), as they always are by a cancel.
	Force bool `json:"force,omitempty"`
	// DryRun only counts what the action would touch.
	DryRun bool `json:"dry_run"`
	// Actor is who asks (set by the API from the token; the CLI's "cli").
	Actor string `json:"-"`
}

// BulkResult says what a bulk action touched.
type BulkResult struct {
	Action Action `json:"action"`
	DryRun bool   `json:"dry_run"`
	// Matched: intents the filter selects (at the start).
	Matched int `json:"matched"`
	// Applied: intents the action changed; Skipped: those it did not, by
	// reason: moved on meanwhile (another status: the status's name; an
	// attempt in flight: in_flight; deleted: gone), or refused because
	// their effect may have happened (effect_possible: a retry without
	// Force, a cancel). A dry run counts effect_possible among the matched
	// intents (the others it cannot foresee); a reason with no intent is
	// absent.
	Applied int            `json:"applied"`
	Skipped map[string]int `json:"skipped"`
	// IDs (a dry run) are the first BulkPreviewIDs intents, in the order
	// the action would take them (by id), it would touch: matched and not
	// skipped for their effect.
	IDs []int64 `json:"ids,omitempty"`
}

func (r *BulkRequest) where(now time.Time) (sqlWhere, error) {
	if _, ok := allowedFrom[r.Action]; !ok {
		return sqlWhere{}, inputErr("action", "must be retry, cancel or resolve, got %q", r.Action)
	}
	if r.Status == "" {
		return sqlWhere{}, inputErr("status", "is required: the status of the intents to %s", r.Action)
	}
	ok := false
	for _, s := range allowedFrom[r.Action] {
		ok = ok || s == r.Status
	}
	if !ok {
		return sqlWhere{}, inputErr("status", "%s applies to intents that are %s, not %s", r.Action, joinStatuses(allowedFrom[r.Action]), r.Status)
	}
	if err := checkText("kind", r.Kind, "resource", r.Resource, "resource_prefix", r.ResourcePrefix, "search", r.Search); err != nil {
		return sqlWhere{}, err
	}
	var w sqlWhere
	w.add("status = $%d", string(r.Status))
	if r.Kind != "" {
		w.add("kind = $%d", r.Kind)
	}
	if r.Resource != "" {
		w.add("resource_id = $%d", r.Resource)
	}
	if r.ResourcePrefix != "" {
		// A prefix, not a pattern: LIKE's wildcards in it are literal.
		esc := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(r.ResourcePrefix)
		w.add("resource_id LIKE $%d || '%%'", esc)
	}
	if len(r.Search) > MaxSearchLen {
		return sqlWhere{}, inputErr("search", "must be at most %d bytes", MaxSearchLen)
	}
	if err := addCommon(&w, r.Search, r.Since, r.Until, now); err != nil {
		return sqlWhere{}, err
	}
	if len(r.IDs) > MaxListLimit {
		return sqlWhere{}, inputErr("ids", "must be at most %d intents, got %d", MaxListLimit, len(r.IDs))
	}
	for _, id := range r.IDs {
		if id < 1 {
			return sqlWhere{}, inputErr("ids", "must be intent ids (at least 1), got %d", id)
		}
	}
	if r.IDs != nil {
		w.add("intent_id = ANY($%d)", r.IDs)
	}
	// The action on each intent: Apply's rules (outcome, force, note), so
	// that a dry run refuses what the run would. Only a dry run's resolve
	// may leave the outcome out (it counts, and records nothing), and only
	// a run records an actor.
	one := ActionRequest{IntentID: 1, Action: r.Action, Actor: r.Actor, Outcome: r.Outcome, Note: r.Note, Force: r.Force}
	if r.DryRun {
		one.Actor = cmp.Or(one.Actor, "dry run")
		if r.Action == ActionResolve && r.Outcome == "" {
			one.Outcome = outbox.StatusSucceeded
		}
	}
	if err := one.validate(); err != nil {
		return sqlWhere{}, err
	}
	return w, nil
}

// Validate checks the request without reading anything: what Bulk
// refuses as bad input before it begins (the filter, and the action's
// outcome, force and note as Apply checks them, on a dry run too), so
// that a caller can refuse it before connecting.
func (r BulkRequest) Validate() error {
	_, err := r.where(time.Now())
	return err
}

func parseWhen(raw string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(raw); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Parse(time.RFC3339, raw)
}

// Bulk runs req: with DryRun it counts the intents the filter selects;
// otherwise it acts on each of them with Apply (its own transaction, the
// action recorded in the intent's history with the actor), reading them
// in batches of BulkBatch by intent id. An intent that moved on meanwhile
// is skipped and counted, never forced; so is one whose effect is possible
// (retry without Force, cancel).
func (o *Operator) Bulk(ctx context.Context, req BulkRequest) (BulkResult, error) {
	res := BulkResult{Action: req.Action, DryRun: req.DryRun, Skipped: map[string]int{}}
	if err := o.actor(); err != nil {
		return res, err
	}
	w, err := req.where(time.Now())
	if err != nil {
		return res, err
	}
	var possible int
	if err := o.pool.QueryRow(ctx, o.sch.SQL(`SELECT count(*), count(*) FILTER (WHERE effect = 'possible') FROM fencegate.intents WHERE `+w.where()), w.args...).
		Scan(&res.Matched, &possible); err != nil {
		return res, fmt.Errorf("operator: bulk %s: count: %w", req.Action, err)
	}
	if req.DryRun {
		if refusesPossible(req) && possible > 0 {
			res.Skipped[SkippedEffectPossible] = possible
		}
		// The first it would touch, in the order it would: those refused
		// for their effect left out.
		touch := w.where()
		if refusesPossible(req) {
			touch += " AND effect <> 'possible'"
		}
		rows, err := o.pool.Query(ctx, o.sch.SQL(fmt.Sprintf(`SELECT intent_id FROM fencegate.intents WHERE %s ORDER BY intent_id LIMIT %d`, touch, BulkPreviewIDs)), w.args...)
		if err != nil {
			return res, fmt.Errorf("operator: bulk %s: preview: %w", req.Action, err)
		}
		if res.IDs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return res, fmt.Errorf("operator: bulk %s: preview: %w", req.Action, err)
		}
		return res, nil
	}
	var after int64
	for {
		args := append(append([]any{}, w.args...), after, BulkBatch)
		n := len(w.args)
		rows, err := o.pool.Query(ctx, o.sch.SQL(fmt.Sprintf(`SELECT intent_id FROM fencegate.intents WHERE %s AND intent_id > $%d ORDER BY intent_id LIMIT $%d`, w.where(), n+1, n+2)), args...)
		if err != nil {
			return res, fmt.Errorf("operator: bulk %s: %w", req.Action, err)
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return res, err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return res, err
		}
		if len(ids) == 0 {
			return res, nil
		}
		for _, id := range ids {
			_, err := o.Apply(ctx, ActionRequest{IntentID: id, Action: req.Action, Actor: req.Actor, Outcome: req.Outcome, Note: req.Note, Force: req.Force})
			var ise *InvalidStateError
			switch {
			case err == nil:
				res.Applied++
			case errors.As(err, &ise) && ise.Effect != "":
				res.Skipped[SkippedEffectPossible]++
			case errors.As(err, &ise) && ise.InFlight:
				res.Skipped["in_flight"]++
			case errors.As(err, &ise):
				res.Skipped[string(ise.Status)]++
			case errors.Is(err, outbox.ErrNotFound):
				res.Skipped["gone"]++
			default:
				return res, err
			}
		}
		after = ids[len(ids)-1]
	}
}

// SkippedEffectPossible is the BulkResult.Skipped reason of intents whose
// effect is possible.
const SkippedEffectPossible = "effect_possible"

// refusesPossible says whether req's action refuses intents whose effect is
// possible: a cancel always, a retry without Force.
func refusesPossible(req BulkRequest) bool {
	return req.Action == ActionCancel || (req.Action == ActionRetry && !req.Force)
}

// joinStatuses writes ss as "failed, unknown".
func joinStatuses(ss []outbox.Status) string {
	var b strings.Builder
	for i, s := range ss {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(string(s))
	}
	return b.String()
}
