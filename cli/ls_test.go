package cli

import (
	"context"
	"encoding/json"
	"fmt"
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
