package bench

import (
	"math"
	"slices"
	"testing"
	"time"
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

// The max-rate row counts outcomes recorded while the enqueuers ran, from
// the first one on: a pipeline slower to come through than the window is
// not reported as settling nothing (the row read 0 on a loaded machine
// with a 400 ms window), and the window's opening, one latency long, is
// not counted against a pipeline that keeps up.
func TestSustainedRate(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, c := range []struct {
		name string
		w    window
		want float64
	}{
		// 1,000/s enqueued for 5 s, each settled 100 ms later: 4,900 in the
		// window, the first at 101 ms: 1,000/s, not 980.
		{"keeps up", window{start: at(0), end: at(5000), first: at(101), last: at(5100), n: 5000, inWindow: 4900}, 4900 / 4.899},
		// The latency (800 ms) is longer than the window (400 ms): nothing
		// settled in it; all 100 over the 900 ms until the last settled.
		{"latency longer than the window", window{start: at(0), end: at(400), first: at(800), last: at(900), n: 100, inWindow: 0}, 100 / 0.9},
		{"one settled in the window", window{start: at(0), end: at(400), first: at(399), last: at(1000), n: 100, inWindow: 1}, 100 / 1.0},
		{"nothing enqueued", window{start: at(0), end: at(400), first: at(400), last: at(400)}, 0},
	} {
		if got := c.w.sustainedRate(); math.Abs(got-c.want) > 1e-6*c.want+1e-9 {
			t.Errorf("%s: sustainedRate = %.3f; want %.3f", c.name, got, c.want)
		}
		if c.w.n > 0 && c.w.sustainedRate() <= 0 {
			t.Errorf("%s: %d intents settled, rate %v", c.name, c.w.n, c.w.sustainedRate())
		}
	}
}
