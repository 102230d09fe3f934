package cli

import (
	"os"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// benchJSON runs `gateway bench --json` with args on the test server (a
// database of its own, dropped afterwards) and an embedded NATS server,
// checks exit 0, and returns the output with its rows by name.
func benchJSON(t *testing.T, args ...string) (cliResult, map[string]map[string]any) {
	t.Helper()
	r := gw(t, "", append([]string{"bench", "--json", "--database-url", testdb.Server(t)}, args...)...)
	expectCode(t, r, 0, "")
	cases, _ := r.obj["cases"].([]any)
	rows := map[string]map[string]any{}
	for _, c := range cases {
		m, _ := c.(map[string]any)
		name, _ := m["name"].(string)
		rows[name] = m
	}
	return r, rows
}

// gateway bench --case enqueue --json prints one JSON object with the case
// next to its baseline and a description of the machine, briefly.
func TestBenchJSONShape(t *testing.T) {
	t.Parallel()
	r, rows := benchJSON(t, "--case", "enqueue", "--duration", "1s")
	c := rows["enqueue"]
	if len(rows) != 1 || c["unit"] != "intents/s" {
		t.Fatalf("cases = %s; want the one case enqueue, in intents/s", r.stdout)
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

// The new cases, briefly: file-drain against its raw baseline, e2e-drain
// (a small backlog, through gateway run as shipped) against the relay
// alone, and e2e's latency rows, in one JSON object.
func TestBenchDrainCasesJSON(t *testing.T) {
	t.Parallel()
	r, rows := benchJSON(t, "--case", "file-drain,e2e-latency,e2e-drain", "--duration", "400ms", "--drain-intents", "500",
		"--file-dir", t.TempDir())
	for name, unit := range map[string]string{"file-drain": "files/s", "e2e-drain": "intents/s", "e2e-p50": "ms", "e2e-p99": "ms", "e2e-max-rate": "intents/s"} {
		c := rows[name]
		if c == nil || c["unit"] != unit {
			t.Fatalf("row %s = %v; want unit %s (%s)", name, c, unit, r.stdout)
		}
		if v, ok := c["value"].(float64); !ok || v <= 0 {
			t.Fatalf("row %s value = %v (%s)", name, c["value"], r.stdout)
		}
	}
	for _, name := range []string{"file-drain", "e2e-drain"} {
		for _, k := range []string{"baseline", "ratio"} {
			if v, ok := rows[name][k].(float64); !ok || v <= 0 {
				t.Fatalf("row %s %s = %v; want a positive number (%s)", name, k, rows[name][k], r.stdout)
			}
		}
	}
	// The e2e cases run gateway run with its own pool sizing: the relay
	// (1 spare + 6 + 1 sweeper) and the no-op adapter with group commit
	// (10 shared + min(256, 8) + 1 key sweeper).
	for _, name := range []string{"e2e-drain", "e2e-p50"} {
		if note, _ := rows[name]["note"].(string); !strings.Contains(note, "db_max_conns=27") {
			t.Errorf("row %s note = %q; want gateway run's pool of 27", name, note)
		}
	}
	// e2e-drain's budget per settled intent: the columns measured on any
	// server, and the others either measured or named absent with the
	// reason (the test server may lack pg_stat_statements). The server's
	// CPU is measured on a given server too when it runs here, as the one
	// testenv started does.
	budget, _ := rows["e2e-drain"]["budget"].(map[string]any)
	if budget == nil || budget["units"] != 500.0 || budget["unit"] != "intent" {
		t.Fatalf("e2e-drain budget = %v; want one per intent over the 500 (%s)", budget, r.stdout)
	}
	for _, k := range []string{"gateway_cpu_us_per_intent", "wal_bytes_per_intent", "round_trips_per_intent", "row_versions_per_intent_total"} {
		if v, ok := budget[k].(float64); !ok || v <= 0 {
			t.Errorf("budget %s = %v; want a positive number (%s)", k, budget[k], r.stdout)
		}
	}
	absent, _ := budget["absent"].(map[string]any)
	pgCPU, measured := budget["pg_cpu_us_per_intent"].(float64)
	if os.Getenv("GATEWAY_TEST_POSTMASTER_PID") != "" && (!measured || pgCPU <= 0 || absent["pg_cpu_us_per_intent"] != nil) {
		t.Errorf("budget pg_cpu_us_per_intent = %v, absent = %v; want measured (the server runs here, started by testenv)", budget["pg_cpu_us_per_intent"], absent)
	}
	if measured == (absent["pg_cpu_us_per_intent"] != nil) {
		t.Errorf("budget pg_cpu_us_per_intent = %v, absent = %v; want one of them", budget["pg_cpu_us_per_intent"], absent)
	}
	if m, _ := r.obj["machine"].(map[string]any); m["postgres_cpu_measured"] != measured {
		t.Errorf("machine postgres_cpu_measured = %v; want %v", m["postgres_cpu_measured"], measured)
	}
	if _, ok := budget["statements_per_intent"].(float64); ok == (absent["statements_per_intent"] != nil) {
		t.Errorf("budget statements_per_intent = %v, absent = %v; want one of them", budget["statements_per_intent"], absent)
	}
	tables, _ := budget["row_versions_per_intent"].(map[string]any)
	intents, _ := tables["intents"].(map[string]any)
	// Every settled intent is updated at least once (its outcome), and its
	// row was inserted before the drain, outside the budget.
	if upd, _ := intents["updated"].(float64); upd < 1 || intents["inserted"] != 0.0 || intents["hot_share"] == nil {
		t.Errorf("row versions of intents = %v; want >= 1 update, no insert, a HOT share (%s)", intents, r.stdout)
	}
	t.Logf("budget per intent: %d tables, %.1f row versions, %.0f WAL bytes, %.2f round trips; absent: %v",
		len(tables), budget["row_versions_per_intent_total"], budget["wal_bytes_per_intent"], budget["round_trips_per_intent"], absent)
	expectCode(t, gw(t, "", "bench", "--drain-intents", "5"), 2, "invalid_input")
	expectCode(t, gw(t, "", "bench", "--river-peer", t.TempDir()), 2, "invalid_input")
}
