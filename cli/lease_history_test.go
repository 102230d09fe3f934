package cli

import (
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

func TestLeaseHistoryCLI(t *testing.T) {
	t.Parallel()
	db := testdb.NewURL(t)
	for _, args := range [][]string{
		{"lease", "acquire", "--resource", "report", "--holder", "A", "--ttl", "30s"},
		{"lease", "release", "--resource", "report", "--holder", "A", "--epoch", "1"},
		{"lease", "acquire", "--resource", "report", "--holder", "B", "--ttl", "30s"},
		{"epoch", "advance", "--resource", "report", "--epoch", "10"},
	} {
		expectCode(t, gw(t, db, args...), 0, "")
	}

	r := gw(t, db, "lease", "history", "--resource", "report")
	expectCode(t, r, 0, "")
	grants, _ := r.obj["grants"].([]any)
	if r.obj["resource"] != "report" || len(grants) != 3 {
		t.Fatalf("history = %s; want 3 grants of report", r.stdout)
	}
	want := []struct {
		epoch     float64
		how, prev string
	}{{10, "external_advance", "B"}, {2, "released", "A"}, {1, "free", ""}}
	for i, w := range want {
		g := grants[i].(map[string]any)
		prev, _ := g["previous_holder"].(string)
		if g["epoch"] != w.epoch || g["how"] != w.how || prev != w.prev || g["granted_at"] == nil {
			t.Fatalf("grant %d = %v; want epoch %v how %s previous %q", i, g, w.epoch, w.how, w.prev)
		}
	}

	r = gw(t, db, "lease", "history", "--resource", "report", "--limit", "1")
	expectCode(t, r, 0, "")
	if grants, _ := r.obj["grants"].([]any); len(grants) != 1 {
		t.Fatalf("history --limit 1 = %s", r.stdout)
	}
	// Never granted: an empty list, not an error.
	r = gw(t, db, "lease", "history", "--resource", "nothing-here")
	expectCode(t, r, 0, "")
	if grants, ok := r.obj["grants"].([]any); !ok || len(grants) != 0 {
		t.Fatalf("history of an unknown resource = %s; want grants []", r.stdout)
	}

	// Bad input: exit 2 naming the field, also with the database
	// unreachable.
	expectInvalidAnyDB(t, db, []invalidArgs{
		{[]string{"lease", "history"}, "resource"},
		{[]string{"lease", "history", "--resource", ""}, "resource"},
		{[]string{"lease", "history", "--resource", "report", "--limit", "0"}, "limit"},
		{[]string{"lease", "history", "--resource", "report", "--limit", "1001"}, "limit"},
		{[]string{"lease", "history", "--resource", "report", "--limit", "many"}, "limit"},
		{[]string{"lease", "history", "--resource", "report", "extra"}, "args"},
	})
}
