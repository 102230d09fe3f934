package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/kinds/webhookkind"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Limits of a list page.
const (
	DefaultListLimit = 50
	MaxListLimit     = 500
)

// Statuses lists every intent status, in lifecycle order.
var Statuses = []outbox.Status{
	outbox.StatusPending, outbox.StatusRelayed, outbox.StatusSucceeded, outbox.StatusFailed,
	outbox.StatusSuperseded, outbox.StatusUnknown, outbox.StatusCancelled,
}

// ListFilter selects a page of intents, newest first. Zero fields don't
// filter.
type ListFilter struct {
	Resource string
	Status   outbox.Status
	Kind     string
	// Search finds intents whose operation id, idempotency key or kind's
	// main payload field (Destination) contains it, ignoring case; at most
	// MaxSearchLen bytes.
	Search string
	// Since and Until bound the intents' last change (updated_at), as a
	// bulk action's do: a duration back from now ("2h") or an RFC 3339
	// time; Since inclusive, Until exclusive.
	Since, Until string
	// Limit is the page size, 1 to MaxListLimit. Zero: DefaultListLimit.
	Limit int
	// Cursor is the next_cursor of the previous page; empty for the first.
	Cursor string
}

// ParseListFilter builds a ListFilter from text (query parameters, flags)
// and checks it; an *fenceerr.InvalidError names the bad field.
func ParseListFilter(resource, status, kind, limit, cursor string) (ListFilter, error) {
	f := ListFilter{Resource: resource, Status: outbox.Status(status), Kind: kind, Cursor: cursor}
	if limit != "" {
		// An explicit 0 is an error, not the default; the message quotes
		// what was given.
		n, err := strconv.Atoi(limit)
		if err != nil || n < 1 || n > MaxListLimit {
			return ListFilter{}, inputErr("limit", "must be an integer from 1 to %d, got %q", MaxListLimit, limit)
		}
		f.Limit = n
	}
	return f, f.Validate()
}

// Validate checks f; an *fenceerr.InvalidError names the bad field.
func (f ListFilter) Validate() error {
	if f.Status != "" && !slices.Contains(Statuses, f.Status) {
		return inputErr("status", "must be one of pending, relayed, succeeded, failed, superseded, unknown, cancelled; got %q", f.Status)
	}
	if f.Limit < 0 || f.Limit > MaxListLimit {
		return inputErr("limit", "must be from 1 to %d, got %d", MaxListLimit, f.Limit)
	}
	if err := checkText("resource", f.Resource, "kind", f.Kind, "search", f.Search); err != nil {
		return err
	}
	if len(f.Resource) > outbox.MaxResourceLen {
		return inputErr("resource", "must be at most %d bytes", outbox.MaxResourceLen)
	}
	if len(f.Kind) > outbox.MaxKindLen {
		return inputErr("kind", "must be at most %d bytes", outbox.MaxKindLen)
	}
	if len(f.Search) > MaxSearchLen {
		return inputErr("search", "must be at most %d bytes", MaxSearchLen)
	}
	if _, err := f.conds(time.Now(), true); err != nil {
		return err
	}
	if _, err := f.cursorID(); err != nil {
		return err
	}
	return nil
}

// cursorID decodes the cursor: the id of the last intent of the previous
// page (the keyset). Clients treat it as opaque.
func (f ListFilter) cursorID() (int64, error) {
	if f.Cursor == "" {
		return 0, nil
	}
	id, err := strconv.ParseInt(f.Cursor, 10, 64)
	if err != nil || id < 1 {
		return 0, inputErr("cursor", "is not a cursor this server returned: %q", f.Cursor)
	}
	return id, nil
}

// Page is a page of intents, newest first.
type Page struct {
	// Intents are without their payloads (Get has them).
	Intents []outbox.Record `json:"intents"`
	// NextCursor continues the listing; nil on the last page.
	NextCursor *string `json:"next_cursor"`
}

const listColumns = `intent_id, resource_id, epoch, operation_id, kind, idempotency_key, fence,
	status, attempts, result, last_error, created_at, updated_at, relayed_at, completed_at, coalesce(principal, ''),
	effect, not_before`

// List returns a page of intents matching f, newest (highest id)
// first. Pagination is by keyset on intent_id, not by offset: a page starts
// strictly below the previous page's last id, so intents committed while a
// client pages through neither shift pages (no duplicates) nor hide older
// ones (no gaps); new intents appear on a fresh first page.
func (o *Operator) List(ctx context.Context, f ListFilter) (Page, error) {
	rows, next, err := o.list(ctx, f)
	if err != nil {
		return Page{}, err
	}
	p := Page{Intents: make([]outbox.Record, len(rows)), NextCursor: next}
	for i, r := range rows {
		p.Intents[i] = r.Record
	}
	return p, nil
}

// RowPage is a page of Rows, newest first.
type RowPage struct {
	Rows []Row
	// NextCursor continues the listing; nil on the last page.
	NextCursor *string
}

// Row is an intent of a list as people read it: the record (without the
// payload) and its destination.
type Row struct {
	outbox.Record
	// Destination is the kind's main payload field: an email's
	// recipients (to, cc, bcc), a file's target, a webhook's URL, an s3
	// object's bucket/key; empty for other kinds.
	Destination string
}

// ListRows is List with each intent's Destination (the admin pages).
func (o *Operator) ListRows(ctx context.Context, f ListFilter) (RowPage, error) {
	rows, next, err := o.list(ctx, f)
	return RowPage{Rows: rows, NextCursor: next}, err
}

func (o *Operator) list(ctx context.Context, f ListFilter) ([]Row, *string, error) {
	if err := f.Validate(); err != nil {
		return nil, nil, err
	}
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	after, _ := f.cursorID()
	w, err := f.conds(time.Now(), true)
	if err != nil {
		return nil, nil, err
	}
	if after > 0 {
		w.add("intent_id < $%d", after)
	}
	// One row more than the page tells whether a next page exists. Only
	// the filters given are in the statement, so each combination gets a
	// plan of its own: the indexes (resource_id, intent_id DESC), the
	// partial ones by status, or the primary key backward serve them.
	args := append(w.args, f.Limit+1)
	rows, err := o.q.Query(ctx, o.sch.SQL(`SELECT `+listColumns+`, `+destinationSQL+` FROM fencegate.intents
		WHERE `+w.where()+fmt.Sprintf(` ORDER BY intent_id DESC LIMIT $%d`, len(args))), args...)
	if err != nil {
		return nil, nil, fmt.Errorf("operator: list intents: %w", err)
	}
	defer rows.Close()
	out := []Row{}
	for rows.Next() {
		var row Row
		r := &row.Record
		var fence, status, effect string
		var result []byte
		var dest *string
		if err := rows.Scan(&r.IntentID, &r.Resource, &r.Epoch, &r.OperationID, &r.Kind, &r.IdempotencyKey, &fence,
			&status, &r.Attempts, &result, &r.LastError, &r.CreatedAt, &r.UpdatedAt, &r.RelayedAt, &r.CompletedAt, &r.Principal,
			&effect, &r.NotBefore, &dest); err != nil {
			return nil, nil, fmt.Errorf("operator: list intents: %w", err)
		}
		r.Fence, r.Status, r.Effect = outbox.Fence(fence), outbox.Status(status), outbox.Effect(effect)
		if result != nil {
			r.Result = result
		}
		if dest != nil {
			row.Destination = *dest
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("operator: list intents: %w", err)
	}
	var next *string
	if len(out) > f.Limit {
		out = out[:f.Limit]
		c := strconv.FormatInt(out[f.Limit-1].IntentID, 10)
		next = &c
	}
	return out, next, nil
}

// Event is one entry of an intent's history: an action and the status
// change it made.
type Event struct {
	EventID    int64         `json:"event_id"`
	IntentID   int64         `json:"intent_id"`
	At         time.Time     `json:"at"`
	Actor      string        `json:"actor"`
	Action     string        `json:"action"`
	FromStatus outbox.Status `json:"from_status"`
	ToStatus   outbox.Status `json:"to_status"`
	Note       *string       `json:"note"`
	// LastError is the intent's last_error when the action was taken (a
	// retry clears it on the intent; it is kept here).
	LastError *string `json:"last_error,omitempty"`
}

// TimelineEntry is one point of an intent's life: created, relayed and
// completed from its timestamps, and each Event. Pages draw it as is.
type TimelineEntry struct {
	At    time.Time `json:"at"`
	What  string    `json:"what"`
	Actor string    `json:"actor,omitempty"`
	// Status is the status the intent had after this point, when known.
	Status outbox.Status `json:"status,omitempty"`
	Note   *string       `json:"note,omitempty"`
}

// IntentDetail is an intent with its payload, history, attempts and
// timeline.
type IntentDetail struct {
	outbox.Record
	History []Event `json:"history"`
	// TraceID is the OpenTelemetry trace the intent's enqueue belonged to
	// (its stored W3C trace context); the relay and the attempts continue
	// it. Empty when the enqueue was not traced.
	TraceID string `json:"trace_id,omitempty"`
	// AttemptHistory is one entry per attempt, in order (Attempts counts
	// them).
	AttemptHistory []Attempt       `json:"attempt_history"`
	Timeline       []TimelineEntry `json:"timeline"`
}

// Attempt is one attempt of an intent (an execution, or the takeover of
// an abandoned one): when it ran, in which process, how it ended. Every
// time is PostgreSQL's clock.
type Attempt struct {
	// Attempt is its number, from 1.
	Attempt int `json:"attempt"`
	// StartedAt is nil for an attempt that never recorded its end
	// (abandoned: written by the attempt that took its key over).
	StartedAt *time.Time `json:"started_at"`
	EndedAt   time.Time  `json:"ended_at"`
	// DurationMS is EndedAt - StartedAt in milliseconds, nil with
	// StartedAt.
	DurationMS *float64 `json:"duration_ms"`
	Process    *string  `json:"process"`
	// Outcome: the intent status it recorded (succeeded, failed, unknown,
	// superseded), or retry, retry_key_kept, waiting_for_proof,
	// lookup_failed, lost_key, abandoned (docs/http-api.md).
	Outcome string `json:"outcome"`
	// ErrorClass: retryable, permanent, unknown or unclassified.
	ErrorClass *string `json:"error_class"`
	Error      *string `json:"error"`
	// Lookup: what a lookup at the destination found (found, not_found,
	// error); nil when the attempt looked nothing up.
	Lookup *string `json:"lookup"`
	// RetryAfterMS is the destination's Retry-After, in milliseconds.
	RetryAfterMS *int64 `json:"retry_after_ms"`
	// NotBefore: the next attempt was not due before then.
	NotBefore *time.Time `json:"not_before"`
	// KeyToken is the idempotency key's token the attempt held: attempts
	// under one token share a key; a retry that gave the key back starts
	// the next attempt under a new key (whose own attempts count restarts).
	KeyToken *int64 `json:"key_token"`
}

// Get returns the intent with its history, or outbox.ErrNotFound.
func (o *Operator) Get(ctx context.Context, id int64) (*IntentDetail, error) {
	var d IntentDetail
	r := &d.Record
	var fence, status, effect string
	var payload, result, traceCtx []byte
	err := o.q.QueryRow(ctx, o.sch.SQL(`SELECT `+listColumns+`, payload, trace_context FROM fencegate.intents WHERE intent_id = $1`), id).Scan(
		&r.IntentID, &r.Resource, &r.Epoch, &r.OperationID, &r.Kind, &r.IdempotencyKey, &fence,
		&status, &r.Attempts, &result, &r.LastError, &r.CreatedAt, &r.UpdatedAt, &r.RelayedAt, &r.CompletedAt, &r.Principal,
		&effect, &r.NotBefore, &payload, &traceCtx)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, outbox.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("operator: get intent %d: %w", id, err)
	}
	r.Fence, r.Status, r.Payload, r.Effect = outbox.Fence(fence), outbox.Status(status), shownPayload(r.Kind, payload), outbox.Effect(effect)
	if result != nil {
		r.Result = result
	}
	if sc := trace.SpanContextFromContext(outbox.ContextFromTrace(ctx, traceCtx)); sc.IsValid() {
		d.TraceID = sc.TraceID().String()
	}
	if d.History, err = o.History(ctx, id); err != nil {
		return nil, err
	}
	if d.AttemptHistory, err = o.Attempts(ctx, id); err != nil {
		return nil, err
	}
	d.Timeline = timeline(r, d.History, d.AttemptHistory)
	return &d, nil
}

// shownPayload is a payload as the reads return it, to the API, the pages
// and the CLI alike: a credential that an intent stored before such values
// were refused carries inline (a webhook's Authorization header) is
// replaced by "(redacted)". Redacting here, where every reader gets the
// payload, keeps one place that can leak it.
func shownPayload(kind string, payload []byte) json.RawMessage {
	if kind == webhookkind.Name {
		return webhookkind.Redact(payload)
	}
	return payload
}

// History returns the intent's events in the order they happened.
func (o *Operator) History(ctx context.Context, id int64) ([]Event, error) {
	rows, err := o.q.Query(ctx, o.sch.SQL(`SELECT event_id, intent_id, at, actor, action, from_status, to_status, note, last_error
		FROM fencegate.intent_events WHERE intent_id = $1 ORDER BY event_id`), id)
	if err != nil {
		return nil, fmt.Errorf("operator: history of intent %d: %w", id, err)
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) {
		var e Event
		var from, to string
		err := row.Scan(&e.EventID, &e.IntentID, &e.At, &e.Actor, &e.Action, &from, &to, &e.Note, &e.LastError)
		e.FromStatus, e.ToStatus = outbox.Status(from), outbox.Status(to)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("operator: history of intent %d: %w", id, err)
	}
	if events == nil {
		events = []Event{}
	}
	return events, nil
}

// Attempts returns the intent's attempts in order.
func (o *Operator) Attempts(ctx context.Context, id int64) ([]Attempt, error) {
	rows, err := o.q.Query(ctx, o.sch.SQL(`SELECT attempt, started_at, ended_at,
			extract(epoch FROM ended_at - started_at) * 1000, process, outcome, error_class, error, lookup,
			(extract(epoch FROM retry_after) * 1000)::bigint, not_before, key_token
		FROM fencegate.intent_attempts WHERE intent_id = $1 ORDER BY attempt`), id)
	if err != nil {
		return nil, fmt.Errorf("operator: attempts of intent %d: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := row.Scan(&a.Attempt, &a.StartedAt, &a.EndedAt, &a.DurationMS, &a.Process, &a.Outcome, &a.ErrorClass,
			&a.Error, &a.Lookup, &a.RetryAfterMS, &a.NotBefore, &a.KeyToken)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("operator: attempts of intent %d: %w", id, err)
	}
	if out == nil {
		out = []Attempt{}
	}
	return out, nil
}

// timeline merges the timestamps of r with its events. relayed_at and
// completed_at hold only the latest relay and completion (a retry clears
// them), so earlier ones show through the events alone.
func timeline(r *outbox.Record, events []Event, attempts []Attempt) []TimelineEntry {
	t := []TimelineEntry{{At: r.CreatedAt, What: "created", Status: outbox.StatusPending}}
	if r.RelayedAt != nil {
		t = append(t, TimelineEntry{At: *r.RelayedAt, What: "relayed", Status: outbox.StatusRelayed})
	}
	if r.CompletedAt != nil {
		t = append(t, TimelineEntry{At: *r.CompletedAt, What: "completed", Status: r.Status})
	}
	for _, e := range events {
		t = append(t, TimelineEntry{At: e.At, What: e.Action, Actor: e.Actor, Status: e.ToStatus, Note: e.Note})
	}
	for _, a := range attempts {
		if a.StartedAt != nil {
			t = append(t, TimelineEntry{At: *a.StartedAt, What: fmt.Sprintf("attempt %d started", a.Attempt), Actor: deref(a.Process)})
		}
		note := attemptNote(a)
		t = append(t, TimelineEntry{At: a.EndedAt, What: fmt.Sprintf("attempt %d: %s", a.Attempt, a.Outcome), Actor: deref(a.Process), Note: &note})
	}
	slices.SortStableFunc(t, func(a, b TimelineEntry) int { return a.At.Compare(b.At) })
	return t
}

// ResourceView is a resource's control row and its intents counted by
// status.
type ResourceView struct {
	Resource       string     `json:"resource"`
	Epoch          int64      `json:"epoch"`
	Holder         *string    `json:"holder"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	// LeaseLive is judged by PostgreSQL's clock.
	LeaseLive bool `json:"lease_live"`
	// Counts has every status, zero included.
	Counts map[outbox.Status]int64 `json:"counts"`
	Total  int64                   `json:"total"`
}

// ErrResourceNotFound is returned by Resource for a resource with
// neither a control row nor intents. It matches fenceerr.ErrNotFound.
var ErrResourceNotFound = fenceerr.NotFound("resource not found")

// Resource returns the resource's control row and counts, or
// ErrResourceNotFound.
func (o *Operator) Resource(ctx context.Context, resource string) (*ResourceView, error) {
	if err := lease.ValidateResource(resource); err != nil {
		var le *lease.InvalidError
		if errors.As(err, &le) {
			return nil, inputErr("resource", "%s", le.Message)
		}
		return nil, err
	}
	v := &ResourceView{Resource: resource, Counts: map[outbox.Status]int64{}}
	for _, s := range Statuses {
		v.Counts[s] = 0
	}
	found := true
	err := o.q.QueryRow(ctx, o.sch.SQL(`SELECT epoch, holder, lease_expires_at, coalesce(lease_expires_at > now(), false)
		FROM fencegate.resources WHERE resource_id = $1`), resource).Scan(&v.Epoch, &v.Holder, &v.LeaseExpiresAt, &v.LeaseLive)
	if errors.Is(err, pgx.ErrNoRows) {
		found = false
	} else if err != nil {
		return nil, fmt.Errorf("operator: get resource %q: %w", resource, err)
	}
	rows, err := o.q.Query(ctx, o.sch.SQL(`SELECT status, count(*) FROM fencegate.intents WHERE resource_id = $1 GROUP BY status`), resource)
	if err != nil {
		return nil, fmt.Errorf("operator: count intents of %q: %w", resource, err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("operator: count intents of %q: %w", resource, err)
		}
		v.Counts[outbox.Status(s)] = n
		v.Total += n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("operator: count intents of %q: %w", resource, err)
	}
	if !found && v.Total == 0 {
		return nil, ErrResourceNotFound
	}
	return v, nil
}

// Epochs returns the resource's epoch grants, newest first, at most limit
// of them (limit 0: lease.DefaultHistoryLimit), as lease.Issuer.History
// does. An unknown resource has no grants; so has one whose epochs were
// all granted before the history existed (Resource tells them apart).
func (o *Operator) Epochs(ctx context.Context, resource string, limit int) ([]lease.Grant, error) {
	return o.issuer.History(ctx, resource, limit)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// attemptNote says in one line how long an attempt took and what it found.
func attemptNote(a Attempt) string {
	var parts []string
	if a.DurationMS != nil {
		parts = append(parts, fmt.Sprintf("took %s", time.Duration(*a.DurationMS*float64(time.Millisecond)).Round(time.Millisecond)))
	}
	if a.Lookup != nil {
		parts = append(parts, "lookup: "+*a.Lookup)
	}
	if a.ErrorClass != nil {
		parts = append(parts, *a.ErrorClass+" error")
	}
	if a.Error != nil {
		parts = append(parts, *a.Error)
	}
	if a.RetryAfterMS != nil {
		parts = append(parts, fmt.Sprintf("Retry-After %s", time.Duration(*a.RetryAfterMS)*time.Millisecond))
	}
	if a.NotBefore != nil {
		parts = append(parts, "next attempt not before "+a.NotBefore.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, "; ")
}
