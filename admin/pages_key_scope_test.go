package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// Under the global key scope two resources' intents may share an
// idempotency key. A scoped operator's intent page does not show the
// key's record when the intent that owns it (or created it) is another
// resource's, outside the scope: not that intent's id and link, nor the
// key's last_error, which speaks of the other resource's effect. It
// showed both. An unscoped operator still sees them.
func TestIntentPageHidesAKeyOwnedOutsideTheScope(t *testing.T) {
	const scopedOp = "scoped-operator-secret-0123456"
	e := setupWith(t, append(slices.Clone(testTokens),
		Token{Name: "billing-ops", Role: RoleOperator, Secret: scopedOp, Resources: []string{"billing"}}))
	e.atEpochOne("billing", "payroll")
	ctx := context.Background()
	enqueue := func(res string) int64 {
		r, err := e.ob.Enqueue(ctx, outbox.Intent{Resource: res, Epoch: 1, OperationID: "op-" + res, IdempotencyKey: "shared-key", Kind: "file",
			Payload: json.RawMessage(`{"target":"x.txt","content":"x"}`)})
		if err != nil {
			t.Fatal(err)
		}
		return r.IntentID
	}
	other, mine := enqueue("payroll"), enqueue("billing")
	// The key as payroll's attempt left it (the runtime's record).
	if _, err := e.pool.Exec(ctx, testdb.SQL(`INSERT INTO fencegate.idempotency_keys
		(kind, idempotency_key, fingerprint, state, owner_intent_id, first_intent_id, status, last_error, completed_at)
		VALUES ('file', 'shared-key', 'f', 'completed', $1, $1, 'failed', 'payroll-secret-detail', now())`), other); err != nil {
		t.Fatal(err)
	}
	pc := newPageClient(t, e.ts.URL)
	pc.header.Set("Authorization", "Bearer "+scopedOp)
	r := pc.do("GET", fmt.Sprintf("/intents/%d", mine), nil)
	pc.expect(r, http.StatusOK, "outside your token")
	for _, leak := range []string{fmt.Sprintf("/intents/%d", other), "payroll-secret-detail"} {
		if strings.Contains(r.body, leak) {
			t.Errorf("a scoped operator's intent page shows %q of a key another resource's intent owns", leak)
		}
	}
	pc.header.Set("Authorization", "Bearer "+operatorSecret)
	pc.expect(pc.do("GET", fmt.Sprintf("/intents/%d", mine), nil), http.StatusOK, fmt.Sprintf("/intents/%d", other), "payroll-secret-detail")
}
