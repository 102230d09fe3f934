package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// enqueueOn enqueues an intent of kind with payload on resource r at epoch
// 1, with key (empty: the default), and gives it status.
func (e *env) enqueueOn(op, kind, key, payload string, status outbox.Status) int64 {
	e.t.Helper()
	res, err := e.ob.Enqueue(context.Background(), outbox.Intent{Resource: "r", Epoch: 1, OperationID: op, Kind: kind,
		IdempotencyKey: key, Payload: []byte(payload)})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET status = $2 WHERE intent_id = $1`),
		res.IntentID, string(status)); err != nil {
		e.t.Fatal(err)
	}
	return res.IntentID
}

func rowIDs(rows []Row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.IntentID
	}
	return out
}

// The list's search finds an intent by operation id, idempotency key or
// its kind's main payload field (an email's recipients, cc included, a
// file's target, a webhook's URL, an s3 object's bucket/key), ignoring
// case, as a substring and never as a pattern; each row carries that
// field as its Destination; the status counts follow the other filters;
// the time range bounds the last change; bad input names its field.
func TestListSearchAndCounts(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	mail := e.enqueueOn("daily-1", "email", "invoice-0042", `{"to":["alice@example.com"],"cc":"Carol@Example.com","from":"r@example.com","subject":"s","text":"t"}`, outbox.StatusFailed)
	file := e.enqueueOn("export-1", "file", "", `{"target":"exports/2026/q4.csv","content":"x"}`, outbox.StatusSucceeded)
	hook := e.enqueueOn("pay-1", "webhook", "", `{"url":"https://hooks.example.com/payroll"}`, outbox.StatusFailed)
	s3 := e.enqueueOn("obj-1", "s3", "", `{"bucket":"archive","key":"2026/report_%.pdf","content":"x"}`, outbox.StatusPending)

	for _, c := range []struct {
		search string
		want   []int64
	}{
		{"INVOICE-0042", []int64{mail}},  // the key, any case
		{"daily", []int64{mail}},         // the operation id
		{"carol@example", []int64{mail}}, // a cc recipient
		{"q4.csv", []int64{file}},        // a file's target
		{"hooks.example.com", []int64{hook}},
		{"archive/2026", []int64{s3}}, // bucket/key
		{"report_%", []int64{s3}},     // wildcards are literal
		{"_", []int64{s3}},
		{"nothing-like-it", []int64{}},
		{"", []int64{s3, hook, file, mail}},
	} {
		p, err := e.op.ListRows(ctx, ListFilter{Search: c.search})
		if err != nil {
			t.Fatalf("search %q: %v", c.search, err)
		}
		if got := rowIDs(p.Rows); !slices.Equal(got, c.want) {
			t.Errorf("search %q found %v, want %v", c.search, got, c.want)
		}
	}
	p, err := e.op.ListRows(ctx, ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	dests := map[int64]string{}
	for _, r := range p.Rows {
		dests[r.IntentID] = r.Destination
	}
	want := map[int64]string{mail: "alice@example.com, Carol@Example.com", file: "exports/2026/q4.csv",
		hook: "https://hooks.example.com/payroll", s3: "archive/2026/report_%.pdf"}
	for id, d := range want {
		if dests[id] != d {
			t.Errorf("intent %d: destination %q, want %q", id, dests[id], d)
		}
	}
	t.Logf("%d destinations checked", len(want))

	counts, err := e.op.StatusCounts(ctx, ListFilter{Status: outbox.StatusSucceeded, Search: "example.com"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[outbox.Status]int64{}
	for _, c := range counts {
		got[c.Status] = c.N
	}
	if len(counts) != len(Statuses) || got[outbox.StatusFailed] != 2 || got[outbox.StatusSucceeded] != 0 || got[outbox.StatusPending] != 0 {
		t.Errorf("counts under the search = %+v; want failed 2, others 0, whatever the status filter", counts)
	}

	// The time range bounds updated_at.
	if _, err := e.pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.intents SET updated_at = now() - interval '3 hours' WHERE intent_id = $1`), mail); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		since, until string
		want         []int64
	}{
		{"2h", "", []int64{s3, hook, file}},
		{"", "2h", []int64{mail}},
		{time.Now().Add(-4 * time.Hour).UTC().Format(time.RFC3339), "1h", []int64{mail}},
	} {
		p, err := e.op.ListRows(ctx, ListFilter{Since: c.since, Until: c.until})
		if err != nil {
			t.Fatal(err)
		}
		if ids := rowIDs(p.Rows); !slices.Equal(ids, c.want) {
			t.Errorf("since %q until %q: %v, want %v", c.since, c.until, ids, c.want)
		}
	}

	for _, c := range []struct {
		f     ListFilter
		field string
	}{
		{ListFilter{Since: "yesterday"}, "since"},
		{ListFilter{Until: "-2h"}, "until"},
		{ListFilter{Search: string(make([]byte, MaxSearchLen+1))}, "search"},
	} {
		_, err := e.op.ListRows(ctx, c.f)
		var ie *fenceerr.InvalidError
		if !errors.As(err, &ie) || ie.Field != c.field {
			t.Errorf("%+v: %v, want an invalid-input error naming %s", c.f, err, c.field)
		}
		if _, err := e.op.StatusCounts(ctx, c.f); !errors.As(err, &ie) || ie.Field != c.field {
			t.Errorf("counts %+v: %v, want an invalid-input error naming %s", c.f, err, c.field)
		}
	}
}

// A count stops at CountCap and says so.
func TestStatusCountsCap(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, testdb.SQL(`INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload, status)
		SELECT 'r', 1, 'bulk-' || g, 'email', 'r/bulk-' || g, 'commit', '{}', 'succeeded' FROM generate_series(1, $1) g`), CountCap+5); err != nil {
		t.Fatal(err)
	}
	e.seed("one", outbox.StatusFailed, "x")
	counts, err := e.op.StatusCounts(ctx, ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range counts {
		switch {
		case c.Status == outbox.StatusSucceeded && (c.N != CountCap || !c.AtLeast):
			t.Errorf("succeeded counts %+v, want %d and more", c, CountCap)
		case c.Status == outbox.StatusFailed && (c.N != 1 || c.AtLeast):
			t.Errorf("failed counts %+v, want exactly 1", c)
		}
	}
}

// A bulk action narrowed by search and by picked ids touches only those
// of the picked that its filter selects; its dry run lists the first ids
// it would touch, without those it skips for their effect; bad ids name
// the field.
func TestBulkPickedAndPreviewIDs(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	var failed []int64
	for i := range 4 {
		failed = append(failed, e.seed(fmt.Sprintf("f-%d", i), outbox.StatusFailed, "550"))
	}
	pending := e.seed("p", outbox.StatusPending, "")
	possible := e.seed("u", outbox.StatusUnknown, "lost")
	// The unknown one's effect is possible: a retry without force skips it.
	res, err := e.op.Bulk(ctx, BulkRequest{Action: ActionRetry, Status: outbox.StatusUnknown, DryRun: true})
	if err != nil || res.Matched != 1 || len(res.IDs) != 0 || res.Skipped[SkippedEffectPossible] != 1 {
		t.Fatalf("dry run of unknown = %+v, %v; want 1 matched, no ids (skipped for its effect)", res, err)
	}
	res, err = e.op.Bulk(ctx, BulkRequest{Action: ActionRetry, Status: outbox.StatusFailed, DryRun: true})
	if err != nil || res.Matched != 4 || !slices.Equal(res.IDs, failed) {
		t.Fatalf("dry run = %+v, %v; want the 4 failed ids %v", res, err, failed)
	}
	res, err = e.op.Bulk(ctx, BulkRequest{Action: ActionRetry, Status: outbox.StatusFailed, Search: "F-2", DryRun: true})
	if err != nil || !slices.Equal(res.IDs, []int64{failed[2]}) {
		t.Fatalf("dry run with search = %+v, %v; want [%d]", res, err, failed[2])
	}
	picked := []int64{failed[3], failed[1], pending, possible}
	res, err = e.op.Bulk(ctx, BulkRequest{Action: ActionRetry, Status: outbox.StatusFailed, IDs: picked, Actor: "t"})
	if err != nil || res.Matched != 2 || res.Applied != 2 {
		t.Fatalf("bulk of picked = %+v, %v; want the 2 failed among them", res, err)
	}
	for id, want := range map[int64]outbox.Status{failed[0]: outbox.StatusFailed, failed[1]: outbox.StatusPending, failed[2]: outbox.StatusFailed,
		failed[3]: outbox.StatusPending, pending: outbox.StatusPending, possible: outbox.StatusUnknown} {
		if st := e.status(id); st != want {
			t.Errorf("intent %d is %s, want %s", id, st, want)
		}
	}
	for _, ids := range [][]int64{{0}, {-3}, make([]int64, MaxListLimit+1)} {
		_, err := e.op.Bulk(ctx, BulkRequest{Action: ActionRetry, Status: outbox.StatusFailed, IDs: ids, DryRun: true})
		var ie *fenceerr.InvalidError
		if !errors.As(err, &ie) || ie.Field != "ids" {
			t.Errorf("ids %v: %v, want an invalid-input error naming ids", ids[:1], err)
		}
	}
}

// The resources index pages by id with each resource's epoch, lease and
// counts; a prefix narrows it.
func TestResourcesIndex(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	iss := lease.NewIssuer(e.pool, lease.WithSchema(testdb.Schema()))
	l, err := iss.Acquire(ctx, "billing/eu", "worker-7", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iss.Advance(ctx, "billing/us", 5); err != nil {
		t.Fatal(err)
	}
	e.seed("a", outbox.StatusFailed, "x")
	e.seed("b", outbox.StatusSucceeded, "")

	p, err := e.op.Resources(ctx, ResourceFilter{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Resources) != 2 || p.NextCursor == nil || p.Resources[0].Resource != "billing/eu" || p.Resources[1].Resource != "billing/us" {
		t.Fatalf("first page = %+v", p)
	}
	eu := p.Resources[0]
	if eu.Epoch != l.Epoch || eu.Holder == nil || *eu.Holder != "worker-7" || !eu.LeaseLive || eu.LeaseExpiresAt == nil || eu.Total != 0 {
		t.Errorf("billing/eu = %+v", eu)
	}
	if us := p.Resources[1]; us.Epoch != 5 || us.Holder != nil || us.LeaseLive {
		t.Errorf("billing/us = %+v", us)
	}
	p, err = e.op.Resources(ctx, ResourceFilter{Limit: 2, Cursor: *p.NextCursor})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Resources) != 1 || p.NextCursor != nil || p.Resources[0].Resource != "r" || p.Resources[0].Total != 2 ||
		p.Resources[0].Counts[outbox.StatusFailed] != 1 || p.Resources[0].Counts[outbox.StatusSucceeded] != 1 {
		t.Fatalf("second page = %+v", p)
	}
	p, err = e.op.Resources(ctx, ResourceFilter{Prefix: "billing/"})
	if err != nil || len(p.Resources) != 2 {
		t.Fatalf("prefix billing/ = %+v, %v", p, err)
	}
	// Within keeps a scope's resources (exact names, prefix* patterns)
	// in the read itself: a page and its cursor hold nothing else.
	p, err = e.op.Resources(ctx, ResourceFilter{Limit: 1, Within: []string{"billing/e*", "r"}})
	if err != nil || len(p.Resources) != 1 || p.Resources[0].Resource != "billing/eu" || p.NextCursor == nil || *p.NextCursor != "billing/eu" {
		t.Fatalf("within billing/e*, r: first page = %+v, %v", p, err)
	}
	p, err = e.op.Resources(ctx, ResourceFilter{Limit: 1, Cursor: *p.NextCursor, Within: []string{"billing/e*", "r"}})
	if err != nil || len(p.Resources) != 1 || p.Resources[0].Resource != "r" || p.NextCursor != nil {
		t.Fatalf("within billing/e*, r: second page = %+v, %v", p, err)
	}
	p, err = e.op.Resources(ctx, ResourceFilter{Prefix: "billing/", Within: []string{"billing/u"}})
	if err != nil || len(p.Resources) != 0 {
		t.Fatalf("within the exact name billing/u = %+v, %v", p, err)
	}
	var ie *fenceerr.InvalidError
	if _, err := e.op.Resources(ctx, ResourceFilter{Limit: MaxListLimit + 1}); !errors.As(err, &ie) || ie.Field != "limit" {
		t.Errorf("limit past the maximum: %v", err)
	}
}
