package operator

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/fencegate/fencegate/outbox"
)

// A dry run lists the first BulkPreviewIDs intents it would act on, in
// intent-id order, leaving out those it would skip for their effect; a run
// that is not dry lists none.
func TestBulkDryRunListsIDs(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	var failed []int64
	for i := range BulkPreviewIDs + 5 {
		failed = append(failed, e.seed(fmt.Sprint("failed-", i), outbox.StatusFailed, "boom"))
	}
	// Unknown intents: seed makes their effect possible.
	unknown := []int64{e.seed("unknown-0", outbox.StatusUnknown, "lost"), e.seed("unknown-1", outbox.StatusUnknown, "lost")}

	res, err := e.op.Bulk(ctx, BulkRequest{Action: ActionRetry, Status: outbox.StatusFailed, DryRun: true, Actor: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != len(failed) || !slices.Equal(res.IDs, failed[:BulkPreviewIDs]) {
		t.Fatalf("dry run = %+v; want %d matched and ids %v", res, len(failed), failed[:BulkPreviewIDs])
	}
	// A retry without force would skip the unknown ones: none listed.
	res, err = e.op.Bulk(ctx, BulkRequest{Action: ActionRetry, Status: outbox.StatusUnknown, DryRun: true, Actor: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 2 || res.Skipped[SkippedEffectPossible] != 2 || len(res.IDs) != 0 {
		t.Fatalf("dry run of unknown intents without force = %+v; want 2 matched, 2 skipped, no ids", res)
	}
	res, err = e.op.Bulk(ctx, BulkRequest{Action: ActionRetry, Status: outbox.StatusUnknown, Force: true, DryRun: true, Actor: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.IDs, unknown) {
		t.Fatalf("dry run with force = %+v; want ids %v", res, unknown)
	}
	res, err = e.op.Bulk(ctx, BulkRequest{Action: ActionCancel, Status: outbox.StatusFailed, Actor: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != len(failed) || res.IDs != nil {
		t.Fatalf("cancel = %+v; want %d applied, no ids", res, len(failed))
	}
	t.Logf("dry runs listed %d, 0 and %d ids", BulkPreviewIDs, len(unknown))
}
