package cli

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/cli/internal/bench"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/gateway"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

var grouped = idempotency.Config{Schema: testdb.Schema(), GroupCommit: true}

// The pool of `gateway run` is sized from what the process runs.
func TestPoolSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  gateway.Config
		want int32
	}{
		// Without group commit: 1 spare + 6 dispatcher (4 open claims,
		// samples, LISTEN) + 1 intent sweeper + 2 adapters × 8 + 1 key
		// sweeper.
		{"alone", gateway.Config{Schema: testdb.Schema(), RunDispatcher: true, Adapters: []adapters.Registration{standIn("email"), standIn("file")}, Runtime: runtimeConc(8)}, 25},
		{"relay only", gateway.Config{Schema: testdb.Schema(), RunDispatcher: true}, 8},
		{"one adapter alone", gateway.Config{Schema: testdb.Schema(), Adapters: []adapters.Registration{standIn("file")}, Runtime: runtimeConc(8)}, 10},
		{"high concurrency with admin", gateway.Config{Schema: testdb.Schema(), RunDispatcher: true, Adapters: []adapters.Registration{standIn("email"), standIn("file")},
			Runtime: runtimeConc(32), AdminAddr: "127.0.0.1:8080"}, 1 + 7 + 64 + 1 + 2},
		{"extra executors count as adapters", gateway.Config{Schema: testdb.Schema(), RunDispatcher: true, Adapters: []adapters.Registration{bench.NoopRegistration()},
			Runtime: runtimeConc(16)}, 1 + 7 + 16 + 1},
		{"concurrency unset takes the runtime default", gateway.Config{Schema: testdb.Schema(), Adapters: []adapters.Registration{standIn("file")}}, 1 + executor.DefaultConcurrency + 1},
		{"floor", gateway.Config{Schema: testdb.Schema(), Adapters: []adapters.Registration{standIn("file")}, Runtime: runtimeConc(1)}, 4},
		// run's defaults, with group commit: 1 spare + 6 dispatcher + 1
		// intent sweeper + 10 shared (4 Begin and 4 Complete flushers, 2
		// loads) + 2 adapters × min(256, 8) + 1 key sweeper.
		{"defaults", gateway.Config{Schema: testdb.Schema(), RunDispatcher: true, Adapters: []adapters.Registration{standIn("email"), standIn("file")}, Runtime: runtimeConc(256), Idempotency: grouped}, 35},
		{"grouped, low concurrency", gateway.Config{Schema: testdb.Schema(), Adapters: []adapters.Registration{standIn("file")}, Runtime: runtimeConc(2), Idempotency: grouped}, 1 + 10 + 2 + 1},
	} {
		if got := tc.cfg.PoolSize(); got != tc.want {
			t.Errorf("%s: poolSize = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestURLSetsMaxConns(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"postgres://u:p@h:5432/db":                           false,
		"postgres://u:p@h:5432/db?pool_max_conns=7":          true,
		"postgresql://h/db?sslmode=disable&pool_max_conns=7": true,
		"postgres://u:pool_max_conns=3@h/db":                 false,
		"host=h dbname=db pool_max_conns=7":                  true,
		"host=h dbname=db pool_max_conns = 7":                true,
		"pool_max_conns=7 host=h":                            true,
		"host=h dbname=db":                                   false,
	} {
		if got := urlSets(s, "pool_max_conns"); got != want {
			t.Errorf("urlSets(%q, pool_max_conns) = %v, want %v", s, got, want)
		}
	}
}

// The real pool of a `gateway run` process: sized automatically from its
// components, or --db-max-conns, and a URL's pool_max_conns wins over both.
// The process reports its pool's MaxConns on its "running" line.
func TestRunPoolMaxConns(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	root := t.TempDir()
	maxConns := regexp.MustCompile(`msg="gateway: running".*db_max_conns=(\d+)`)
	for _, tc := range []struct {
		name, url string
		args      []string
		want      string
		env       []string
	}{
		// 1 spare + 6 dispatcher + 1 intent sweeper + 10 shared (group
		// commit) + min(5, 8) + 1 key sweeper.
		{"sized", e.db, nil, "24", nil},
		// Without group commit: 1 + 6 + 1 + 5 + 1.
		{"sized alone", e.db, []string{"--idempotency-group-commit=false"}, "14", nil},
		{"flag", e.db, []string{"--db-max-conns", "9"}, "9", nil},
		{"url wins", withQuery(e.db, "pool_max_conns=3"), []string{"--db-max-conns", "9"}, "3", nil},
		// Every flag of run also from the environment; the command line
		// wins over it.
		{"env", e.db, nil, "9", []string{"GATEWAY_DB_MAX_CONNS=9"}},
		{"flag over env", e.db, []string{"--db-max-conns", "7"}, "7", []string{"GATEWAY_DB_MAX_CONNS=9"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--adapters", "file", "--file-root", root, "--adapter-concurrency", "5"}, tc.args...)
			p := startRun(t, tc.env, tc.url, e.natsURL, args...)
			var got string
			pollUntil(t, 30*time.Second, "the running line", func() (bool, string) {
				m := maxConns.FindStringSubmatch(p.stderr.String())
				if m != nil {
					got = m[1]
				}
				return m != nil, p.stderr.String()
			})
			if got != tc.want {
				t.Errorf("db_max_conns=%s, want %s", got, tc.want)
			}
			p.stop(t)
		})
	}

	out := runBadFlags(t, nil, []string{"--db-max-conns", "-1"}, "db_max_conns")
	if !strings.Contains(out, "--db-max-conns") {
		t.Errorf("the error does not name the flag: %s", out)
	}
}

func runtimeConc(n int) executor.Config { return executor.Config{Concurrency: n} }

// withQuery adds a query parameter to a URL.
func withQuery(u, kv string) string {
	if strings.Contains(u, "?") {
		return u + "&" + kv
	}
	return u + "?" + kv
}

// --log-format json writes slog JSON lines (here from the environment,
// GATEWAY_LOG_FORMAT): the running line is one JSON object. Durations are
// written as the text format writes them ("30s"), not as a bare number of
// nanoseconds (30000000000), which slog's JSON handler wrote.
func TestRunLogFormatJSON(t *testing.T) {
	t.Parallel()
	p := newRunEnv(t).run(t, []string{"GATEWAY_LOG_FORMAT=json"}, "--adapters", "file", "--file-root", t.TempDir())
	lines := func() []map[string]any {
		var ms []map[string]any
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil {
				ms = append(ms, m)
			}
		}
		return ms
	}
	pollUntil(t, 30*time.Second, "a JSON running line", func() (bool, string) {
		for _, m := range lines() {
			if m["msg"] == "gateway: running" && m["db_max_conns"] != nil {
				return true, ""
			}
		}
		return false, p.stderr.String()
	})
	for _, m := range lines() {
		if m["msg"] == "dispatcher: started" {
			if m["claim_ttl"] != "30s" || m["poll_interval"] != "1s" {
				t.Fatalf("dispatcher: started with claim_ttl %#v, poll_interval %#v; want \"30s\", \"1s\"", m["claim_ttl"], m["poll_interval"])
			}
			return
		}
	}
	t.Fatalf("no JSON line \"dispatcher: started\":\n%s", p.stderr.String())
}
