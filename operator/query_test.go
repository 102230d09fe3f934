package operator

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/outbox"
)

// FuzzListQuery feeds arbitrary query strings to the list filter parser:
// it never panics, and an accepted filter always validates.
func FuzzListQuery(f *testing.F) {
	for _, seed := range [][5]string{
		{"", "", "", "", ""},
		{"r", "pending", "email", "50", "123"},
		{"", "done", "", "0", "x"},
		{"", "", "", "-1", "-5"},
		{"", "", "", "99999999999999999999", "9223372036854775808"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3], seed[4])
	}
	f.Fuzz(func(t *testing.T, resource, status, kind, limit, cursor string) {
		lf, err := ParseListFilter(resource, status, kind, limit, cursor)
		if err != nil {
			var ie *fenceerr.InvalidError
			if !errors.As(err, &ie) || ie.Field == "" {
				t.Fatalf("error %v does not name a field", err)
			}
			return
		}
		if err := lf.Validate(); err != nil {
			t.Fatalf("accepted filter fails Validate: %v", err)
		}
		if lf.Limit < 0 || lf.Limit > MaxListLimit {
			t.Fatalf("limit %d accepted", lf.Limit)
		}
	})
}

// An Operator ReadingFrom a transaction reads what the transaction sees —
// an action of its own, not yet committed — while the pool's Operator
// does not see it yet.
func TestReadingFromTransaction(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	id := e.seed("op", outbox.StatusFailed, "boom")
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, e.op.sch.SQL(`UPDATE fencegate.intents SET status = 'cancelled' WHERE intent_id = $1`), id); err != nil {
		t.Fatal(err)
	}
	in := e.op.ReadingFrom(tx)
	d, err := in.Get(ctx, id)
	if err != nil || d.Status != outbox.StatusCancelled {
		t.Fatalf("Get in the transaction = %+v, %v; want cancelled", d, err)
	}
	page, err := in.List(ctx, ListFilter{Status: outbox.StatusCancelled})
	if err != nil || len(page.Intents) != 1 {
		t.Fatalf("List in the transaction = %+v, %v; want the one intent", page, err)
	}
	v, err := in.Resource(ctx, "r")
	if err != nil || v.Counts[outbox.StatusCancelled] != 1 || v.Counts[outbox.StatusFailed] != 0 {
		t.Fatalf("Resource in the transaction = %+v, %v", v, err)
	}
	if d, err := e.op.Get(ctx, id); err != nil || d.Status != outbox.StatusFailed {
		t.Fatalf("Get on the pool = %+v, %v; want failed (uncommitted change unseen)", d, err)
	}
}

// Get names the trace an intent's enqueue belonged to (trace_id, shown on
// the intent's page), and none for an untraced enqueue.
func TestGetTraceID(t *testing.T) {
	e := setup(t)
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	res, err := e.ob.Enqueue(ctx, outbox.Intent{Resource: "r", Epoch: 1, OperationID: "traced", Kind: "email",
		Payload: []byte(`{"to":"alice@example.com","from":"reports@example.com","subject":"hi","text":"body"}`)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.op.Get(context.Background(), res.IntentID)
	if err != nil || d.TraceID != tid.String() {
		t.Fatalf("Get = trace_id %q, %v; want %s", d.TraceID, err, tid)
	}
	untraced := e.seed("untraced", outbox.StatusPending, "")
	if d, err := e.op.Get(context.Background(), untraced); err != nil || d.TraceID != "" {
		t.Fatalf("untraced intent: trace_id %q, %v; want none", d.TraceID, err)
	}
}

// A list's limit outside 1 to MaxListLimit is refused naming limit, and
// the message quotes the value given (an explicit 0 included: it is not
// the default).
func TestParseListFilterLimitQuotesValue(t *testing.T) {
	t.Parallel()
	values := []string{"0", "-3", "501", "99999999999999999999", "x", "1.5"}
	for _, v := range values {
		_, err := ParseListFilter("", "", "", v, "")
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != "limit" || !strings.Contains(inv.Message, strconv.Quote(v)) {
			t.Errorf("limit %q: %v; want an InvalidError naming limit, quoting %q", v, err, v)
		}
	}
	if len(values) == 0 {
		t.Fatal("no value checked")
	}
	t.Logf("%d limits checked", len(values))
	for _, v := range []string{"1", "500"} {
		if _, err := ParseListFilter("", "", "", v, ""); err != nil {
			t.Errorf("limit %s: %v", v, err)
		}
	}
}
