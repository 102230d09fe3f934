package main

import (
	"testing"

	"github.com/fencegate/fencegate/internal/testdb"
)

// gateway bench --case enqueue --json prints one JSON object with the case
// next to its baseline and a description of the machine. It runs on the
// test server (a database of its own, dropped afterwards) and an embedded
// NATS server, briefly.
func TestBenchJSONShape(t *testing.T) {
	t.Parallel()
	base := testdb.Server(t)
	r := gw(t, "", "bench", "--case", "enqueue", "--duration", "1s", "--json", "--database-url", base)
	expectCode(t, r, 0, "")
	cases, ok := r.obj["cases"].([]any)
	if !ok || len(cases) != 1 {
		t.Fatalf("cases = %s", r.stdout)
	}
	c, ok := cases[0].(map[string]any)
	if !ok || c["name"] != "enqueue" || c["unit"] != "intents/s" {
		t.Fatalf("case = %v", cases[0])
	}
	for _, k := range []string{"value", "baseline", "ratio"} {
		if v, ok := c[k].(float64); !ok || v <= 0 {
			t.Fatalf("case %s = %v; want a positive number (%s)", k, c[k], r.stdout)
		}
	}
	m, ok := r.obj["machine"].(map[string]any)
	if !ok {
		t.Fatalf("machine = %s", r.stdout)
	}
	for _, k := range []string{"cpus", "go", "os", "arch"} {
		if m[k] == nil {
			t.Fatalf("machine lacks %s: %s", k, r.stdout)
		}
	}

	// Bad input: exit 2, nothing started.
	expectCode(t, gw(t, "", "bench", "--case", "nope"), 2, "invalid_input")
	expectCode(t, gw(t, "", "bench", "--duration", "1ns"), 2, "invalid_input")
}
