package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// A scoped operator's resources index lists the resources of its scope
// and tells nothing of the others: not their names (a page that ended on
// another resource linked onwards with ?cursor=<that name>), nor how many
// a page left out (which, with the prefix filter, said whether any
// resource starts with a given string: a scoped token could spell out
// every other resource's name).
func TestResourcesIndexScoped(t *testing.T) {
	const scopedOp = "scoped-operator-secret-0123456"
	e := setupWith(t, append(slices.Clone(testTokens),
		Token{Name: "reports-ops", Role: RoleOperator, Secret: scopedOp, Resources: []string{"reports/*", "billing"}}))
	// More resources outside the scope than a page holds, sorting before
	// those inside it.
	for i := range operator.DefaultListLimit + 10 {
		e.atEpochOne(fmt.Sprintf("payroll-%02d", i))
	}
	e.atEpochOne("billing", "billing-eu", "reports/daily", "reports/weekly")

	pc := newPageClient(t, e.ts.URL)
	pc.header.Set("Authorization", "Bearer "+scopedOp)
	r := pc.do("GET", "/resources", nil)
	pc.expect(r, http.StatusOK, `data-resource="billing"`, `data-resource="reports/daily"`, `data-resource="reports/weekly"`)
	for _, leak := range []string{"payroll", "billing-eu", "outside your token"} {
		if strings.Contains(r.body, leak) {
			t.Errorf("a scoped operator's resources index tells of %q:\n%s", leak, r.body)
		}
	}
	// The prefix filter is no oracle: a prefix of other resources answers
	// as a prefix of none does.
	answer := func(prefix string) string {
		r := pc.do("GET", "/resources?prefix="+prefix, nil)
		pc.expect(r, http.StatusOK)
		return strings.ReplaceAll(r.body, prefix, "PREFIX")
	}
	if some, none := answer("payroll-1"), answer("nosuch-1"); some != none {
		t.Errorf("the index answers a prefix of other resources unlike one of none:\n%s\n---\n%s", some, none)
	}
	pc.expect(pc.do("GET", "/resources?prefix=reports/", nil), http.StatusOK, `data-resource="reports/daily"`)

	// An unscoped operator sees every resource, a page at a time.
	pc.header.Set("Authorization", "Bearer "+operatorSecret)
	pc.expect(pc.do("GET", "/resources", nil), http.StatusOK, `data-resource="billing-eu"`, `id="next-page"`)
}

// formFields is what a browser would submit of the form with id on a
// page: its inputs' names and values (check boxes left out, as when
// unticked; selects and text areas too: the caller sets them).
func formFields(t *testing.T, body, id string) url.Values {
	t.Helper()
	m := regexp.MustCompile(`(?s)<form[^>]*id="` + regexp.QuoteMeta(id) + `"[^>]*>(.*?)</form>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no form %q on the page:\n%s", id, body)
	}
	attr := func(tag, name string) (string, bool) {
		a := regexp.MustCompile(`\s` + name + `="([^"]*)"`).FindStringSubmatch(tag)
		if a == nil {
			return "", false
		}
		return html.UnescapeString(a[1]), true
	}
	out := url.Values{}
	for _, tag := range regexp.MustCompile(`<input[^>]*>`).FindAllString(m[1], -1) {
		name, ok := attr(tag, "name")
		if typ, _ := attr(tag, "type"); !ok || typ == "checkbox" {
			continue
		}
		v, _ := attr(tag, "value")
		out.Add(name, v)
	}
	return out
}

// The list's bulk form acts on what the list shows. Filtered by a
// resource (the list's filter is an exact name), the form was prefilled
// with it as a resource prefix: its preview and apply took every resource
// whose name starts with it ("billing-eu" with "billing") too.
func TestBulkFormKeepsTheListsResource(t *testing.T) {
	e := setup(t)
	e.atEpochOne("billing", "billing-eu")
	mine := []int64{e.seedIntent(workerSecret, "billing", "a", outbox.StatusFailed, "550"),
		e.seedIntent(workerSecret, "billing", "b", outbox.StatusFailed, "550")}
	other := e.seedIntent(workerSecret, "billing-eu", "c", outbox.StatusFailed, "550")

	c := newPageClient(t, e.ts.URL)
	if r := c.do("POST", "/login", url.Values{"token": {operatorSecret}}); r.code != http.StatusSeeOther {
		t.Fatalf("login: %d %s", r.code, r.body)
	}
	r := c.do("GET", "/intents?status=failed&resource=billing", nil)
	c.expect(r, http.StatusOK, fmt.Sprintf(`data-intent="%d"`, mine[0]), fmt.Sprintf(`data-intent="%d"`, mine[1]))
	if strings.Contains(r.body, fmt.Sprintf(`data-intent="%d"`, other)) {
		t.Fatal("the list filtered by resource billing shows billing-eu's intent")
	}
	form := formFields(t, r.body, "bulk-form")
	form.Set("action", "cancel")
	r = c.do("POST", "/intents/bulk", form)
	c.expect(r, http.StatusOK, `id="bulk-apply"`)
	var previewed []string
	for _, m := range regexp.MustCompile(`data-intent="(\d+)"`).FindAllStringSubmatch(r.body, -1) {
		previewed = append(previewed, m[1])
	}
	if want := []string{fmt.Sprint(mine[0]), fmt.Sprint(mine[1])}; !slices.Equal(previewed, want) {
		t.Errorf("the preview of the list's bulk form would touch %v, want the list's %v", previewed, want)
	}
	r = c.do("POST", "/intents/bulk", formFields(t, r.body, "bulk-apply-form"))
	if loc := r.hdr.Get("Location"); r.code != http.StatusSeeOther || !strings.Contains(loc, "resource=billing&") {
		t.Errorf("apply = %d Location %q, want 303 to the list of resource billing", r.code, loc)
	}
	for _, id := range mine {
		if got := e.status(id); got != outbox.StatusCancelled {
			t.Errorf("intent %d of billing is %s, want cancelled", id, got)
		}
	}
	if got := e.status(other); got != outbox.StatusFailed {
		t.Errorf("billing-eu's intent %d is %s: the bulk form of the list of billing acted on it", other, got)
	}
}

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
