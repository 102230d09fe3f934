package admin

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// A credential given inline in a webhook payload is refused at the intake
// (400 naming the header, the value not echoed, nothing stored); one
// stored before that rule is shown redacted by the API and the intent
// page, which never carry its value.
func TestWebhookCredentialsNotShown(t *testing.T) {
	e := setup(t)
	e.atEpochOne("billing")
	intent := func(op, headers string) string {
		return fmt.Sprintf(`{"resource":"billing","epoch":1,"operation_id":%q,"kind":"webhook",
			"payload":{"url":"https://billing.example/charge","body":{"amount":1},"headers":%s}}`, op, headers)
	}

	r := e.do("POST", "/api/v1/intents", workerSecret, intent("inline", `{"Authorization":"Bearer api-cred-inline-1"}`))
	expectField(t, r, "payload.headers.Authorization")
	if strings.Contains(r.raw, "api-cred-inline-1") {
		t.Fatalf("the refusal echoes the credential: %s", r.raw)
	}
	if n := e.count(`SELECT count(*) FROM fencegate.intents WHERE operation_id = 'inline'`); n != 0 {
		t.Fatalf("%d intents stored for a refused enqueue", n)
	}

	r = e.do("POST", "/api/v1/intents", workerSecret, intent("by-secret", `{"Authorization":{"secret":"billing-api"},"X-Tenant":"t1"}`))
	expect(t, r, http.StatusCreated, "")
	id := num(r.obj["intent_id"])
	// As an intent stored before the rule holds it.
	if _, err := e.pool.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents
		SET payload = jsonb_set(payload, '{headers}', '{"Authorization":"Bearer api-cred-stored-2","X-Api-Key":"api-cred-stored-3","X-Tenant":"t1"}')
		WHERE intent_id = $1`), id); err != nil {
		t.Fatal(err)
	}

	r = e.do("GET", fmt.Sprintf("/api/v1/intents/%d", id), operatorSecret, "")
	expect(t, r, http.StatusOK, "")
	if strings.Contains(r.raw, "api-cred-stored") {
		t.Fatalf("the API shows a stored credential: %s", r.raw)
	}
	headers, _ := r.obj["payload"].(map[string]any)["headers"].(map[string]any)
	if headers["Authorization"] != "(redacted)" || headers["X-Api-Key"] != "(redacted)" || headers["X-Tenant"] != "t1" {
		t.Fatalf("API payload headers %v: want Authorization and X-Api-Key redacted, X-Tenant as stored", headers)
	}

	c := newPageClient(t, e.ts.URL)
	c.header.Set("Authorization", "Bearer "+operatorSecret)
	page := c.do("GET", fmt.Sprintf("/intents/%d", id), nil)
	c.expect(page, http.StatusOK, "(redacted)", "X-Tenant", "billing.example")
	if strings.Contains(page.body, "api-cred-stored") {
		t.Fatalf("the intent page shows a stored credential:\n%s", page.body)
	}
	t.Logf("intake refusal, API (%d bytes) and page (%d bytes) checked", len(r.raw), len(page.body))
}
