package admin

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/operator"
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
