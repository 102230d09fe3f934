//go:build failpoints

package failpoint

import "testing"

func TestParse(t *testing.T) {
	m, err := parse("a=pause, b=2*crash,c=sleep(150ms)")
	if err != nil {
		t.Fatal(err)
	}
	if m["a"].kind != "pause" || m["b"].kind != "crash" || m["b"].left.Load() != 2 || m["c"].sleep.String() != "150ms" {
		t.Fatalf("parse = %+v", m)
	}
	for _, bad := range []string{"a", "a=boom", "a=0*crash", "a=sleep(x)"} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%q) succeeded", bad)
		}
	}
}
