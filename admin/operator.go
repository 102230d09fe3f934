package admin

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/operator"
)

// The operator's queries and actions are package operator's; the
// deprecated names below keep programs that call them through package
// admin compiling and answering alike.

// Action is an operator's action on an intent.
//
// Deprecated: use operator.Action.
type Action = operator.Action

// Actions.
//
// Deprecated: use operator.ActionRetry, operator.ActionCancel and
// operator.ActionResolve.
const (
	ActionRetry   = operator.ActionRetry
	ActionCancel  = operator.ActionCancel
	ActionResolve = operator.ActionResolve
)

// MaxNoteLen is the longest note on an action, in bytes.
//
// Deprecated: use operator.MaxNoteLen.
const MaxNoteLen = operator.MaxNoteLen

// ForcedNote begins the note of the event a forced retry records.
//
// Deprecated: use operator.ForcedNote.
const ForcedNote = operator.ForcedNote

// ActionRequest asks for one action on one intent.
//
// Deprecated: use operator.ActionRequest.
type ActionRequest = operator.ActionRequest

// InvalidStateError says the intent's status does not allow the action.
//
// Deprecated: use operator.InvalidStateError.
type InvalidStateError = operator.InvalidStateError

// KeyChange says what an action did to the intent's idempotency key.
//
// Deprecated: use operator.KeyChange.
type KeyChange = operator.KeyChange

// Key changes.
//
// Deprecated: use operator.KeyUntouched, operator.KeyUnheld,
// operator.KeyDeleted and operator.KeyCompleted.
const (
	KeyUntouched = operator.KeyUntouched
	KeyUnheld    = operator.KeyUnheld
	KeyDeleted   = operator.KeyDeleted
	KeyCompleted = operator.KeyCompleted
)

// ActionResult is what an action did.
//
// Deprecated: use operator.ActionResult.
type ActionResult = operator.ActionResult

// Apply performs an operator action in one transaction.
//
// Deprecated: use operator.New and Operator.Apply.
func Apply(ctx context.Context, pool *pgxpool.Pool, schema string, req ActionRequest) (ActionResult, error) {
	op, err := operator.New(pool, schema)
	if err != nil {
		return ActionResult{}, err
	}
	return op.Apply(ctx, req)
}

// BulkBatch is how many intents a bulk action reads at a time.
//
// Deprecated: use operator.BulkBatch.
const BulkBatch = operator.BulkBatch

// BulkRequest is an operator action on every intent a filter selects.
//
// Deprecated: use operator.BulkRequest.
type BulkRequest = operator.BulkRequest

// BulkResult says what a bulk action touched.
//
// Deprecated: use operator.BulkResult.
type BulkResult = operator.BulkResult

// SkippedEffectPossible is the BulkResult.Skipped reason of intents whose
// effect is possible.
//
// Deprecated: use operator.SkippedEffectPossible.
const SkippedEffectPossible = operator.SkippedEffectPossible

// Bulk runs req on every intent its filter selects.
//
// Deprecated: use operator.New and Operator.Bulk.
func Bulk(ctx context.Context, pool *pgxpool.Pool, schema string, req BulkRequest) (BulkResult, error) {
	op, err := operator.New(pool, schema)
	if err != nil {
		return BulkResult{}, err
	}
	return op.Bulk(ctx, req)
}

// Querier is what the queries need from a pool or a transaction.
//
// Deprecated: use operator.Querier.
type Querier = operator.Querier

// Limits of a list page.
//
// Deprecated: use operator.DefaultListLimit and operator.MaxListLimit.
const (
	DefaultListLimit = operator.DefaultListLimit
	MaxListLimit     = operator.MaxListLimit
)

// Statuses lists every intent status, in lifecycle order.
//
// Deprecated: use operator.Statuses.
var Statuses = operator.Statuses

// ListFilter selects a page of intents, newest first.
//
// Deprecated: use operator.ListFilter.
type ListFilter = operator.ListFilter

// ParseListFilter builds a ListFilter from text and checks it.
//
// Deprecated: use operator.ParseListFilter.
func ParseListFilter(resource, status, kind, limit, cursor string) (ListFilter, error) {
	return operator.ParseListFilter(resource, status, kind, limit, cursor)
}

// Page is a page of intents, newest first.
//
// Deprecated: use operator.Page.
type Page = operator.Page

// Event is one entry of an intent's history.
//
// Deprecated: use operator.Event.
type Event = operator.Event

// TimelineEntry is one point of an intent's life.
//
// Deprecated: use operator.TimelineEntry.
type TimelineEntry = operator.TimelineEntry

// IntentDetail is an intent with its payload, history and timeline.
//
// Deprecated: use operator.IntentDetail.
type IntentDetail = operator.IntentDetail

// ResourceView is a resource's control row and its intents counted by
// status.
//
// Deprecated: use operator.ResourceView.
type ResourceView = operator.ResourceView

// ErrResourceNotFound is returned for a resource with neither a control
// row nor intents. It is operator.ErrResourceNotFound.
//
// Deprecated: use operator.ErrResourceNotFound.
var ErrResourceNotFound = operator.ErrResourceNotFound

// reader returns an Operator whose reads run on q.
func reader(q Querier, schema string) (*operator.Operator, error) {
	return operator.NewReader(q, schema)
}

// ListIntents returns a page of intents matching f, newest first.
//
// Deprecated: use operator.New and Operator.List.
func ListIntents(ctx context.Context, q Querier, schema string, f ListFilter) (Page, error) {
	op, err := reader(q, schema)
	if err != nil {
		return Page{}, err
	}
	return op.List(ctx, f)
}

// GetIntent returns the intent with its history, or outbox.ErrNotFound.
//
// Deprecated: use operator.New and Operator.Get.
func GetIntent(ctx context.Context, q Querier, schema string, id int64) (*IntentDetail, error) {
	op, err := reader(q, schema)
	if err != nil {
		return nil, err
	}
	return op.Get(ctx, id)
}

// History returns the intent's events in the order they happened.
//
// Deprecated: use operator.New and Operator.History.
func History(ctx context.Context, q Querier, schema string, id int64) ([]Event, error) {
	op, err := reader(q, schema)
	if err != nil {
		return nil, err
	}
	return op.History(ctx, id)
}

// GetResource returns the resource's control row and counts, or
// ErrResourceNotFound.
//
// Deprecated: use operator.New and Operator.Resource.
func GetResource(ctx context.Context, q Querier, schema string, resource string) (*ResourceView, error) {
	op, err := reader(q, schema)
	if err != nil {
		return nil, err
	}
	return op.Resource(ctx, resource)
}
