package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/outbox"
)

func TestLs(t *testing.T) {
	t.Parallel()
	dbURL, pool := runPool(t)
	ctx := context.Background()
	if _, err := coretest.Issuer(pool).Advance(ctx, "r", 1); err != nil {
		t.Fatal(err)
	}
	ob := coretest.Outbox(t, pool)
	var ids []float64
	for i := range 5 {
		res, err := ob.Enqueue(ctx, outbox.Intent{Resource: "r", Epoch: 1, OperationID: fmt.Sprint("op-", i), Kind: "file",
			Payload: json.RawMessage(`{"target":"a.txt","content":"x"}`)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append([]float64{float64(res.IntentID)}, ids...)
	}
	var got []float64
	cursor := ""
	for {
		args := []string{"ls", "--resource", "r", "--status", "pending", "--kind", "file", "--limit", "2"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		r := gw(t, dbURL, args...)
		expectCode(t, r, 0, "")
		for _, it := range r.obj["intents"].([]any) {
			got = append(got, it.(map[string]any)["intent_id"].(float64))
		}
		next, ok := r.obj["next_cursor"].(string)
		if !ok {
			break
		}
		cursor = next
	}
	if fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("ls pages = %v, want %v", got, ids)
	}
	expectInvalidAnyDB(t, dbURL, []invalidArgs{
		{[]string{"ls", "--status", "done"}, "status"},
		{[]string{"ls", "--limit", "0"}, "limit"},
		{[]string{"ls", "--limit", "501"}, "limit"},
		{[]string{"ls", "--cursor", "x"}, "cursor"},
		{[]string{"ls", "extra"}, "args"},
	})
}

// `gateway ls --limit N` outside 1 to 500 is exit 2 naming limit, before
// connecting, and the message quotes the N given (0 included: it is not
// the default).
func TestLsLimitMessageQuotesValue(t *testing.T) {
	t.Parallel()
	values := []string{"0", "-1", "501", "x"}
	for _, v := range values {
		r := gw(t, unreachableDB, "ls", "--limit", v)
		expectInvalid(t, r, "limit")
		if msg, _ := r.obj["error"].(map[string]any)["message"].(string); !strings.Contains(msg, strconv.Quote(v)) {
			t.Errorf("ls --limit %s: message %q, want it to quote %q", v, msg, v)
		}
	}
	if len(values) == 0 {
		t.Fatal("no value checked")
	}
	t.Logf("%d limits checked", len(values))
}
