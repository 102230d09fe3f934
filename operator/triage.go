package operator

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/outbox"
)

// MaxSearchLen bounds ListFilter.Search and BulkRequest.Search.
const MaxSearchLen = 200

// CountCap bounds each count of StatusCounts: past it a count says only
// "more than CountCap", so a page's counts never read a whole outbox of
// succeeded intents.
const CountCap = 10000

// sqlWhere builds a statement's WHERE from the filters given, each with
// its own parameter, so that the statement holds only those filters and
// gets a plan for them.
type sqlWhere struct {
	conds []string
	args  []any
}

// add appends cond, a format whose %[1]d (or %d) is v's parameter number.
func (w *sqlWhere) add(cond string, v any) {
	w.args = append(w.args, v)
	w.conds = append(w.conds, fmt.Sprintf(cond, len(w.args)))
}

func (w *sqlWhere) where() string {
	if len(w.conds) == 0 {
		return "true"
	}
	return strings.Join(w.conds, " AND ")
}

// recipientsSQL is an email payload's addresses (to, cc, bcc; each a
// string or an array of strings) as one JSON array.
var recipientsSQL = func() string {
	parts := make([]string, 0, 3)
	for _, f := range []string{"to", "cc", "bcc"} {
		parts = append(parts, fmt.Sprintf(`CASE jsonb_typeof(payload->'%[1]s') WHEN 'array' THEN payload->'%[1]s'
			WHEN 'string' THEN jsonb_build_array(payload->'%[1]s') ELSE '[]'::jsonb END`, f))
	}
	return strings.Join(parts, " || ")
}()

// destinationSQL is the kind's main payload field, as text: an email's
// recipients, a file's target, a webhook's URL, an s3 object's
// bucket/key; NULL for other kinds. Payloads were checked at enqueue; the
// CASEs keep a malformed one (written by hand) from failing the list.
var destinationSQL = `CASE kind
	WHEN 'email' THEN (SELECT string_agg(a, ', ') FROM jsonb_array_elements_text(` + recipientsSQL + `) a)
	WHEN 'file' THEN payload->>'target'
	WHEN 'webhook' THEN payload->>'url'
	WHEN 's3' THEN concat_ws('/', nullif(payload->>'bucket', ''), payload->>'key')
	END`

// searchCond matches Search (its parameter %[1]d) in the operation id,
// the idempotency key and the destination, ignoring case. A substring, not
// a pattern: strpos takes no wildcards. No index serves it (see
// migrations/00024): a search reads the rows its other filters leave,
// newest first, until a page is full.
var searchCond = `(strpos(lower(operation_id), lower($%[1]d)) > 0 OR strpos(lower(idempotency_key), lower($%[1]d)) > 0
	OR strpos(lower(coalesce(` + destinationSQL + `, '')), lower($%[1]d)) > 0)`

// conds is f's filters as a WHERE (without the cursor); withStatus false
// leaves the status out (StatusCounts counts each).
func (f ListFilter) conds(now time.Time, withStatus bool) (sqlWhere, error) {
	var w sqlWhere
	if f.Resource != "" {
		w.add("resource_id = $%d", f.Resource)
	}
	if withStatus && f.Status != "" {
		w.add("status = $%d", string(f.Status))
	}
	if f.Kind != "" {
		w.add("kind = $%d", f.Kind)
	}
	if err := addCommon(&w, f.Search, f.Since, f.Until, now); err != nil {
		return sqlWhere{}, err
	}
	return w, nil
}

// addCommon adds the filters a list and a bulk action share: the search
// and the bounds of the last change.
func addCommon(w *sqlWhere, search, since, until string, now time.Time) error {
	if search = strings.TrimSpace(search); search != "" {
		w.add(searchCond, search)
	}
	for _, b := range []struct {
		field, raw, op string
	}{{"since", since, ">="}, {"until", until, "<"}} {
		if b.raw == "" {
			continue
		}
		t, err := parseWhen(b.raw, now)
		if err != nil {
			return inputErr(b.field, "must be a duration back from now (2h) or an RFC 3339 time, got %q", b.raw)
		}
		w.add("updated_at "+b.op+" $%d", t)
	}
	return nil
}

// StatusCount is how many intents of a status a filter selects.
type StatusCount struct {
	Status outbox.Status `json:"status"`
	N      int64         `json:"n"`
	// AtLeast: there are more than N (N is CountCap).
	AtLeast bool `json:"at_least,omitempty"`
}

// StatusCounts counts the intents f selects, whatever f.Status, for each
// status (in Statuses' order), each count stopping at CountCap. One
// statement, one subquery per status written with the status as a
// literal, so that the partial indexes by status (pending, relayed, the
// rare ones) serve theirs; the succeeded intents, nearly all of an
// outbox, stop at the cap.
func (o *Operator) StatusCounts(ctx context.Context, f ListFilter) ([]StatusCount, error) {
	f.Status, f.Cursor = "", ""
	if err := f.Validate(); err != nil {
		return nil, err
	}
	w, err := f.conds(time.Now(), false)
	if err != nil {
		return nil, err
	}
	where := w.where()
	cols := make([]string, len(Statuses))
	for i, st := range Statuses {
		cols[i] = fmt.Sprintf(`(SELECT count(*) FROM (SELECT 1 FROM fencegate.intents WHERE status = '%s' AND %s LIMIT %d) s)`,
			st, where, CountCap+1)
	}
	ns := make([]int64, len(Statuses))
	dst := make([]any, len(ns))
	for i := range ns {
		dst[i] = &ns[i]
	}
	if err := o.q.QueryRow(ctx, o.sch.SQL(`SELECT `+strings.Join(cols, ", ")), w.args...).Scan(dst...); err != nil {
		return nil, fmt.Errorf("operator: count intents by status: %w", err)
	}
	out := make([]StatusCount, len(Statuses))
	for i, st := range Statuses {
		out[i] = StatusCount{Status: st, N: min(ns[i], CountCap), AtLeast: ns[i] > CountCap}
	}
	return out, nil
}

// ResourceFilter selects a page of resources, by id.
type ResourceFilter struct {
	// Prefix keeps the resources whose id starts with it.
	Prefix string
	// Limit is the page size, 1 to MaxListLimit. Zero: DefaultListLimit.
	Limit int
	// Cursor is the next_cursor of the previous page; empty for the first.
	Cursor string
	// Within, when not empty, keeps the resources it names: exact names,
	// or "prefix*" patterns (a scoped token's resources). The query leaves
	// the others out, rather than its caller after it, so that neither a
	// page's length nor its cursor (the last resource's id) tells of them.
	Within []string
}

// ResourcePage is a page of resources in id order.
type ResourcePage struct {
	Resources []ResourceView `json:"resources"`
	// NextCursor continues the listing; nil on the last page.
	NextCursor *string `json:"next_cursor"`
}

// Resources returns a page of resources (those with a control row: every
// resource an epoch was ever issued for) with their epoch, lease and
// intents counted by status, in id order, keyset-paged on the id.
func (o *Operator) Resources(ctx context.Context, f ResourceFilter) (ResourcePage, error) {
	if err := checkText("prefix", f.Prefix, "cursor", f.Cursor); err != nil {
		return ResourcePage{}, err
	}
	switch {
	case len(f.Prefix) > outbox.MaxResourceLen:
		return ResourcePage{}, inputErr("prefix", "must be at most %d bytes", outbox.MaxResourceLen)
	case f.Limit < 0 || f.Limit > MaxListLimit:
		return ResourcePage{}, inputErr("limit", "must be from 1 to %d, got %d", MaxListLimit, f.Limit)
	case len(f.Cursor) > outbox.MaxResourceLen:
		return ResourcePage{}, inputErr("cursor", "is not a cursor this server returned")
	}
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	var w sqlWhere
	if f.Prefix != "" {
		w.add("starts_with(resource_id, $%d)", f.Prefix)
	}
	if f.Cursor != "" {
		w.add("resource_id > $%d", f.Cursor)
	}
	if len(f.Within) > 0 {
		exact, prefixes := []string{}, []string{}
		for _, p := range f.Within {
			if prefix, ok := strings.CutSuffix(p, "*"); ok {
				prefixes = append(prefixes, prefix)
			} else {
				exact = append(exact, p)
			}
		}
		w.args = append(w.args, exact, prefixes)
		w.conds = append(w.conds, fmt.Sprintf(`(resource_id = ANY($%d::text[])
			OR EXISTS (SELECT 1 FROM unnest($%d::text[]) AS p(prefix) WHERE starts_with(resource_id, p.prefix)))`, len(w.args)-1, len(w.args)))
	}
	args := append(w.args, f.Limit+1)
	rows, err := o.q.Query(ctx, o.sch.SQL(`SELECT resource_id, epoch, holder, lease_expires_at, coalesce(lease_expires_at > now(), false)
		FROM fencegate.resources WHERE `+w.where()+` ORDER BY resource_id LIMIT $`+strconv.Itoa(len(args))), args...)
	if err != nil {
		return ResourcePage{}, fmt.Errorf("operator: list resources: %w", err)
	}
	p := ResourcePage{Resources: []ResourceView{}}
	for rows.Next() {
		v := ResourceView{Counts: map[outbox.Status]int64{}}
		if err := rows.Scan(&v.Resource, &v.Epoch, &v.Holder, &v.LeaseExpiresAt, &v.LeaseLive); err != nil {
			rows.Close()
			return ResourcePage{}, fmt.Errorf("operator: list resources: %w", err)
		}
		for _, s := range Statuses {
			v.Counts[s] = 0
		}
		p.Resources = append(p.Resources, v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return ResourcePage{}, fmt.Errorf("operator: list resources: %w", err)
	}
	if len(p.Resources) > f.Limit {
		p.Resources = p.Resources[:f.Limit]
		next := p.Resources[f.Limit-1].Resource
		p.NextCursor = &next
	}
	if len(p.Resources) == 0 {
		return p, nil
	}
	ids := make([]string, len(p.Resources))
	at := map[string]int{}
	for i, v := range p.Resources {
		ids[i], at[v.Resource] = v.Resource, i
	}
	// The counts of the page's resources: the index (resource_id,
	// intent_id DESC) reads each one's intents.
	crows, err := o.q.Query(ctx, o.sch.SQL(`SELECT resource_id, status, count(*) FROM fencegate.intents
		WHERE resource_id = ANY($1) GROUP BY resource_id, status`), ids)
	if err != nil {
		return ResourcePage{}, fmt.Errorf("operator: count intents of resources: %w", err)
	}
	defer crows.Close()
	for crows.Next() {
		var res, st string
		var n int64
		if err := crows.Scan(&res, &st, &n); err != nil {
			return ResourcePage{}, fmt.Errorf("operator: count intents of resources: %w", err)
		}
		v := &p.Resources[at[res]]
		v.Counts[outbox.Status(st)] = n
		v.Total += n
	}
	if err := crows.Err(); err != nil {
		return ResourcePage{}, fmt.Errorf("operator: count intents of resources: %w", err)
	}
	return p, nil
}
