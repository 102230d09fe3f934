package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// gateway policy apply FILE stores a rule set (exit 0, its version), a bad
// one is exit 2 naming the field with nothing stored; gateway policy show
// prints the one in force (version 0 and no document before any).
func TestPolicyApplyShow(t *testing.T) {
	t.Parallel()
	db := testdb.NewURL(t)
	expectCode(t, gw(t, db, "migrate"), 0, "")
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	r := gw(t, db, "policy", "show")
	expectCode(t, r, 0, "")
	if r.obj["version"] != 0.0 || r.obj["document"] != nil {
		t.Fatalf("policy show before any apply: %s", r.stdout)
	}
	bad := write("bad.json", `{"principals": [{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"], "sql_role": ["w"]}]}`)
	r = gw(t, db, "policy", "apply", bad)
	if r.code != 2 || errorField(r) != "principals[0].sql_role" {
		t.Fatalf("policy apply of a misspelt field: exit %d %s; want exit 2 naming principals[0].sql_role", r.code, r.stdout)
	}
	r = gw(t, db, "policy", "apply", filepath.Join(dir, "missing.json"))
	if r.code != 2 || errorField(r) != "file" {
		t.Fatalf("policy apply of a missing file: exit %d %s; want exit 2 naming file", r.code, r.stdout)
	}
	good := write("good.json", `{"principals": [{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"], "sql_roles": ["report_worker"]}]}`)
	r = gw(t, db, "policy", "apply", good)
	expectCode(t, r, 0, "")
	if r.obj["version"] != 1.0 || r.obj["principals"] != 1.0 {
		t.Fatalf("policy apply: %s; want version 1, 1 principal", r.stdout)
	}
	r = gw(t, db, "policy", "show")
	expectCode(t, r, 0, "")
	doc, _ := r.obj["document"].(map[string]any)
	ps, _ := doc["principals"].([]any)
	if r.obj["version"] != 1.0 || r.obj["applied_by"] == "" || len(ps) != 1 {
		t.Fatalf("policy show: %s; want version 1 and the document", r.stdout)
	}
	if p := ps[0].(map[string]any); p["name"] != "reports" || p["key_scope"] != "resource" {
		t.Fatalf("policy show's principal: %v", p)
	}
}
