package cli

import (
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/natstest"
)

// unreachableDB is a database URL nothing answers at, quickly: commands
// check their input before connecting, so bad input is exit 2 there too.
const unreachableDB = "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"

// migratedDB creates the test's own database and runs `gateway migrate`
// on it (exit 0); it returns its URL and a pool on it, closed at the
// test's end.
func migratedDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	db, pool := runPool(t)
	expectCode(t, gw(t, db, "migrate"), 0, "")
	return db, pool
}

// acquireLease takes resource's lease as holder A for 60 s (`gateway lease
// acquire`, exit 0) and returns its epoch as a flag value.
func acquireLease(t *testing.T, db, resource string) string {
	t.Helper()
	r := gw(t, db, "lease", "acquire", "--resource", resource, "--holder", "A", "--ttl", "60s")
	expectCode(t, r, 0, "")
	return jsonNum(r.obj["epoch"])
}

// runEnv is what a test of `gateway run` starts from: a database of its
// own, migrated by `gateway migrate`, a pool on it, and a NATS server.
type runEnv struct {
	db      string
	pool    *pgxpool.Pool
	natsURL string
}

func newRunEnv(t *testing.T) *runEnv {
	t.Helper()
	db, pool := migratedDB(t)
	return &runEnv{db: db, pool: pool, natsURL: natstest.Start(t).URL}
}

// run starts `gateway run` with args (and extra environment) on the
// environment's database and NATS server.
func (e *runEnv) run(t *testing.T, env []string, args ...string) *gatewayProc {
	t.Helper()
	return startRun(t, env, e.db, e.natsURL, args...)
}

// stop sends the process SIGTERM and checks it exits 0 within 30 s.
func (p *gatewayProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0:\n%s", code, p.stderr.String())
	}
	// A clean stop warns of nothing (its own NATS Close was logged as a
	// disconnection with error=<nil>).
	if strings.Contains(p.stderr.String(), `NATS disconnected" component=gateway error=<nil>`) {
		t.Errorf("a clean stop logged a NATS disconnection:\n%s", p.stderr.String())
	}
}

// waitAdmin waits until the admin server on addr answers /healthz 200
// over plain HTTP.
func waitAdmin(t *testing.T, addr string) {
	t.Helper()
	waitHealthz(t, http.DefaultClient, "http://"+addr)
}

// waitHealthz waits until base+"/healthz" answers 200 to client.
func waitHealthz(t *testing.T, client *http.Client, base string) {
	t.Helper()
	pollUntil(t, 30*time.Second, "the admin API at "+base, func() (bool, string) {
		res, err := client.Get(base + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, res.Status
	})
}

// postJSON posts body to url (with token as the bearer, unless empty) and
// returns the status code and the JSON object answered.
func postJSON(t *testing.T, url, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(res.Body).Decode(&m)
	return res.StatusCode, m
}

// expectInvalid checks r is exit 2, invalid_input, naming field.
func expectInvalid(t *testing.T, r cliResult, field string) {
	t.Helper()
	expectCode(t, r, exitBadInput, "invalid_input")
	if f := errorField(r); f != field {
		t.Fatalf("error field %q, want %q: %s", f, field, r.stdout)
	}
}

// invalidArgs is a command line that is bad input naming field.
type invalidArgs struct {
	args  []string
	field string
}

// expectInvalidAnyDB runs the gateway with each case's args against dbURL
// and against an unreachable database: exit 2 naming the case's field both
// times, since input is checked before connecting.
func expectInvalidAnyDB(t *testing.T, dbURL string, cases []invalidArgs) {
	t.Helper()
	for _, c := range cases {
		for _, url := range []string{dbURL, unreachableDB} {
			r := gw(t, url, c.args...)
			expectCode(t, r, exitBadInput, "invalid_input")
			if f := errorField(r); f != c.field {
				t.Errorf("%v: field %q, want %q (%s)", c.args, f, c.field, r.stdout)
			}
		}
	}
}

// badFlagCase is `gateway run` with bad flags (args) or environment (env):
// exit 2 naming field.
type badFlagCase struct {
	name  string
	env   []string
	args  []string
	field string
}

// runBadFlagCases runs each case as a parallel subtest (runBadFlags), and
// checks that secret is in none of their output.
func runBadFlagCases(t *testing.T, secret string, cases []badFlagCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if out := runBadFlags(t, c.env, c.args, c.field); strings.Contains(out, secret) {
				t.Fatalf("a secret leaked: %s", out)
			}
		})
	}
}
