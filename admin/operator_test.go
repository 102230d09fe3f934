package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// The deprecated names of package admin answer as package operator: the
// functions run the same queries and actions, the types are the same.
func TestDeprecatedNamesAnswerAsOperator(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.atEpochOne("r")
	failed := e.seedIntent(workerSecret, "r", "failed", outbox.StatusFailed, "boom")
	pending := e.seedIntent(workerSecret, "r", "pending", outbox.StatusPending, "")
	sch := testdb.Schema()

	res, err := Apply(ctx, e.pool, sch, ActionRequest{IntentID: failed, Action: ActionRetry, Actor: "t"})
	if err != nil || res.Status != outbox.StatusPending || res.FromStatus != outbox.StatusFailed {
		t.Fatalf("Apply = %+v, %v", res, err)
	}
	var ise *InvalidStateError
	if _, err := Apply(ctx, e.pool, sch, ActionRequest{IntentID: pending, Action: ActionResolve, Actor: "t", Outcome: outbox.StatusFailed}); !errors.As(err, &ise) {
		t.Fatalf("Apply resolve of a pending intent = %v, want an *InvalidStateError", err)
	}
	br, err := Bulk(ctx, e.pool, sch, BulkRequest{Action: ActionCancel, Status: outbox.StatusPending, DryRun: true, Actor: "t"})
	if err != nil || br.Matched != 2 {
		t.Fatalf("Bulk dry run = %+v, %v; want 2 matched", br, err)
	}
	f, err := ParseListFilter("r", "", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	page, err := ListIntents(ctx, e.pool, sch, f)
	if err != nil || len(page.Intents) != 2 {
		t.Fatalf("ListIntents = %+v, %v", page, err)
	}
	d, err := GetIntent(ctx, e.pool, sch, failed)
	if err != nil || len(d.History) != 1 || d.History[0].Action != string(ActionRetry) {
		t.Fatalf("GetIntent = %+v, %v", d, err)
	}
	hist, err := History(ctx, e.pool, sch, failed)
	got, _ := json.Marshal(hist)
	want, _ := json.Marshal(d.History)
	if err != nil || string(got) != string(want) {
		t.Fatalf("History = %+v, %v; want %+v", hist, err, d.History)
	}
	v, err := GetResource(ctx, e.pool, sch, "r")
	if err != nil || v.Total != 2 || v.Counts[outbox.StatusPending] != 2 {
		t.Fatalf("GetResource = %+v, %v", v, err)
	}
	if _, err := GetResource(ctx, e.pool, sch, "never-used"); !errors.Is(err, operator.ErrResourceNotFound) || !errors.Is(err, ErrResourceNotFound) {
		t.Fatalf("GetResource of an unknown resource = %v", err)
	}
	var ie *InputError
	if _, err := ListIntents(ctx, e.pool, "Bad-Schema", ListFilter{}); !errors.As(err, &ie) || ie.Field != "schema" {
		t.Fatalf("ListIntents with a bad schema = %v", err)
	}
	// The API answers from the same operator.
	r := e.do("GET", fmt.Sprintf("/api/v1/intents/%d", failed), operatorSecret, "")
	expect(t, r, http.StatusOK, "")
	if len(r.obj["history"].([]any)) != 1 {
		t.Fatalf("API history = %s", r.raw)
	}
}
