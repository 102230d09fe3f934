package policy_test

import (
	"errors"
	"testing"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/policy"
)

// A bad document is refused naming the field; a good one gets its
// defaults (key scope resource).
func TestParse(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ doc, field string }{
		{`{"principals": [{"name": "Reports", "role": "worker", "resources": ["*"], "kinds": ["*"]}]}`, "principals[0].name"},
		{`{"principals": [{"name": "r", "role": "admin", "resources": ["*"], "kinds": ["*"]}]}`, "principals[0].role"},
		{`{"principals": [{"name": "r", "role": "worker", "kinds": ["*"]}]}`, "principals[0].resources"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"]}]}`, "principals[0].kinds"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["a*b"], "kinds": ["*"]}]}`, "principals[0].resources[0]"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["a\u202eb"], "kinds": ["*"]}]}`, "principals[0].resources[0]"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["em*"]}]}`, "principals[0].kinds[0]"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"], "key_scope": "tenant"}]}`, "principals[0].key_scope"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"], "sql_roles": ["Bad Role"]}]}`, "principals[0].sql_roles[0]"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"], "sql_roles": ["w"]},
			{"name": "s", "role": "worker", "resources": ["*"], "kinds": ["*"], "sql_roles": ["w"]}]}`, "principals[1].sql_roles[0]"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"]},
			{"name": "r", "role": "operator", "resources": ["*"]}]}`, "principals[1].name"},
		{`{"principals": [{"name": "r", "role": "worker", "resources": ["*"], "kinds": ["*"], "token": "x"}]}`, "principals[0].token"},
		{`{"principals": [{"name": 7}]}`, "principals[0].name"},
		{`{"principal": []}`, "principal"},
		{`{"principals": []} {}`, "document"},
		{`not json`, "document"},
	} {
		_, err := policy.Parse([]byte(c.doc))
		var ie *fenceerr.InvalidError
		if !errors.As(err, &ie) || ie.Field != c.field {
			t.Errorf("Parse(%s) = %v; want an invalid-input error naming %s", c.doc, err, c.field)
		}
	}
	d, err := policy.Parse([]byte(`{"principals": [{"name": "reports", "role": "worker", "resources": ["reports/*"], "kinds": ["email"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if p := d.Principals[0]; p.KeyScope != policy.KeyScopeResource {
		t.Errorf("default key scope = %q; want %q", p.KeyScope, policy.KeyScopeResource)
	}
}

func TestAllows(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pattern, resource string
		want              bool
	}{
		{"*", "anything", true},
		{"reports/*", "reports/daily", true},
		{"reports/*", "reports", false},
		{"reports/*", "reportsX", false},
		{"billing", "billing", true},
		{"billing", "billing/eu", false},
	} {
		if got := policy.Allows(c.pattern, c.resource); got != c.want {
			t.Errorf("Allows(%q, %q) = %t; want %t", c.pattern, c.resource, got, c.want)
		}
	}
}
