package outagelog

import (
	"log/slog"
	"testing"
)

// An outage is WARN once, DEBUG while it repeats, WARN again when its kind
// changes; the first success after it is a recovery, the next is not.
func TestOutage(t *testing.T) {
	var s State
	steps := []struct {
		kind  string
		level slog.Level
		n     int
	}{
		{"a", slog.LevelWarn, 1}, {"a", slog.LevelDebug, 2}, {"b", slog.LevelWarn, 3}, {"b", slog.LevelDebug, 4},
	}
	for i, st := range steps {
		if level, n := s.Failed(st.kind); level != st.level || n != st.n {
			t.Fatalf("step %d (%s): %v, %d; want %v, %d", i, st.kind, level, n, st.level, st.n)
		}
	}
	if !s.Recovered() || s.Recovered() {
		t.Fatal("the first success after failures is a recovery, the second is not")
	}
	if level, n := s.Failed("b"); level != slog.LevelWarn || n != 1 {
		t.Fatalf("after a recovery: %v, %d; want a new outage at WARN, 1", level, n)
	}
	t.Logf("%d steps checked", len(steps)+3)
}
