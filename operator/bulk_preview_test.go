package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/fencegate/fencegate/fenceerr"
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

// A dry run refuses what the run refuses, before it reads anything: an
// outcome on retry or cancel, a resolve's outcome that is neither
// succeeded nor failed, a note Apply would refuse, a bad filter — each an
// InvalidError naming its field, no intent touched. Only a dry run's
// resolve may leave the outcome out (it counts; the run needs one).
// (The CLI refuses the same before connecting, with Validate:
// cli's TestBulkChecksBeforeConnecting.)
func TestBulkDryRunRefusesWhatTheRunRefuses(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	unknown := e.seed("unknown", outbox.StatusUnknown, "lost")
	failed := e.seed("failed", outbox.StatusFailed, "boom")
	cases := []struct {
		field string
		req   BulkRequest
	}{
		{"outcome", BulkRequest{Action: ActionResolve, Status: outbox.StatusUnknown, Outcome: "bogus"}},
		{"outcome", BulkRequest{Action: ActionResolve, Status: outbox.StatusUnknown, Outcome: outbox.StatusUnknown}},
		{"outcome", BulkRequest{Action: ActionRetry, Status: outbox.StatusFailed, Outcome: outbox.StatusSucceeded}},
		{"outcome", BulkRequest{Action: ActionCancel, Status: outbox.StatusFailed, Outcome: outbox.StatusFailed}},
		{"note", BulkRequest{Action: ActionRetry, Status: outbox.StatusFailed, Note: "a\x00b"}},
		{"note", BulkRequest{Action: ActionCancel, Status: outbox.StatusFailed, Note: "\xff"}},
		{"force", BulkRequest{Action: ActionResolve, Status: outbox.StatusUnknown, Outcome: outbox.StatusFailed, Force: true}},
		{"status", BulkRequest{Action: ActionRetry, Status: "bogus"}},
		{"since", BulkRequest{Action: ActionRetry, Status: outbox.StatusFailed, Since: "yesterday"}},
	}
	checked := 0
	for _, c := range cases {
		for _, dry := range []bool{true, false} {
			req := c.req
			req.DryRun, req.Actor = dry, "t"
			_, err := e.op.Bulk(ctx, req)
			var inv *fenceerr.InvalidError
			if !errors.As(err, &inv) || inv.Field != c.field {
				t.Errorf("%+v: %v; want an InvalidError naming %s", req, err, c.field)
				continue
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no case checked")
	}
	t.Logf("%d refusals checked (%d cases, dry run and run)", checked, len(cases))
	for id, want := range map[int64]outbox.Status{unknown: outbox.StatusUnknown, failed: outbox.StatusFailed} {
		if st := e.status(id); st != want {
			t.Fatalf("intent %d is %s after refused bulk actions, want %s", id, st, want)
		}
	}
	res, err := e.op.Bulk(ctx, BulkRequest{Action: ActionResolve, Status: outbox.StatusUnknown, DryRun: true, Actor: "t"})
	if err != nil || res.Matched != 1 {
		t.Fatalf("dry run of a resolve without an outcome = %+v, %v; want it counted", res, err)
	}
}

// A filter's text that PostgreSQL cannot take (a NUL, bytes that are not
// UTF-8) is bad input naming the field, in a list, the resources index and
// a bulk action alike, before any statement runs: it was sent to the
// server, whose encoding error came back as a 500 with its text.
func TestFilterTextMustBeUTF8WithoutNUL(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.seed("failed", outbox.StatusFailed, "boom")
	bad := map[string]string{"NUL": "a\x00b", "not UTF-8": "a\xffb"}
	checked := 0
	expect := func(what, field string, err error) {
		t.Helper()
		checked++
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != field {
			t.Errorf("%s: %v; want an InvalidError naming %s", what, err, field)
		}
	}
	for name, v := range bad {
		for field, f := range map[string]ListFilter{"resource": {Resource: v}, "kind": {Kind: v}, "search": {Search: v}} {
			_, err := e.op.List(ctx, f)
			expect("list with a "+name+" "+field, field, err)
			expect("ListFilter.Validate with a "+name+" "+field, field, f.Validate())
		}
		_, err := e.op.Resources(ctx, ResourceFilter{Prefix: v})
		expect("resources with a "+name+" prefix", "prefix", err)
		for field, req := range map[string]BulkRequest{
			"kind":            {Kind: v},
			"resource":        {Resource: v},
			"resource_prefix": {ResourcePrefix: v},
			"search":          {Search: v},
		} {
			req.Action, req.Status, req.Actor = ActionRetry, outbox.StatusFailed, "t"
			for _, dry := range []bool{true, false} {
				req.DryRun = dry
				_, err := e.op.Bulk(ctx, req)
				expect(fmt.Sprintf("bulk (dry run %t) with a %s %s", dry, name, field), field, err)
			}
		}
	}
	t.Logf("%d filters with bad text checked", checked)
	if checked == 0 {
		t.Fatal("no filter checked")
	}
}
