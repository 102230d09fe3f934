package bench

import (
	"slices"
	"testing"
)

// --case takes cases and the group e2e, comma-separated: e2e is every
// end-to-end case, whose rows include e2e-drain, e2e-p50, e2e-p99 and the
// growth rows.
func TestBenchCaseSelection(t *testing.T) {
	t.Parallel()
	for list, want := range map[string][]string{
		"e2e":                  {"e2e-latency", "e2e-drain", "growth"},
		"e2e-drain,file-drain": {"file-drain", "e2e-drain"},
		"relay, e2e,growth":    {"relay", "e2e-latency", "e2e-drain", "growth"},
		"all":                  Cases(),
	} {
		got, err := SelectCases(list)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("SelectCases(%q) = %v, %v; want %v", list, got, err, want)
		}
	}
	if _, err := SelectCases("e2e,nope"); err == nil {
		t.Error("an unknown case was accepted")
	}
}
