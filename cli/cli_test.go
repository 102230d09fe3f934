package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

type cliResult struct {
	code   int
	obj    map[string]any
	stdout string
	stderr string
}

// gw runs the gateway binary with GATEWAY_DATABASE_URL=dbURL and checks that
// stdout holds exactly one JSON object.
func gw(t *testing.T, dbURL string, args ...string) cliResult {
	t.Helper()
	return gwEnv(t, nil, dbURL, args...)
}

// gwEnv is gw with extra environment variables (later ones win).
func gwEnv(t *testing.T, env []string, dbURL string, args ...string) cliResult {
	t.Helper()
	r := gwOut(t, env, dbURL, args...)
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	if err := dec.Decode(&r.obj); err != nil {
		t.Fatalf("gateway %v: stdout is not one JSON object: %q (stderr %q)", args, r.stdout, r.stderr)
	}
	if dec.More() {
		t.Fatalf("gateway %v: more than one JSON value on stdout: %q", args, r.stdout)
	}
	return r
}

// gwOut runs the gateway binary as gwEnv does, with stdout piped, without
// expecting JSON.
func gwOut(t *testing.T, env []string, dbURL string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(gatewayBin, args...)
	cmd.Env = append(append(os.Environ(), "GATEWAY_DATABASE_URL="+dbURL), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := cliResult{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run gateway %v: %v", args, err)
	}
	return r
}

func expectCode(t *testing.T, r cliResult, code int, errCode string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d; stdout %s stderr %s", r.code, code, r.stdout, r.stderr)
	}
	if errCode == "" {
		if _, ok := r.obj["error"]; ok {
			t.Fatalf("unexpected error object: %s", r.stdout)
		}
		return
	}
	e, ok := r.obj["error"].(map[string]any)
	if !ok || e["code"] != errCode || e["message"] == "" {
		t.Fatalf("error object = %s; want code %q with a message", r.stdout, errCode)
	}
	if strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 || strings.Contains(r.stderr, "goroutine ") {
		t.Fatalf("stderr should be one line, no stack trace: %q", r.stderr)
	}
}

const cliEmail = `{"to":"alice@example.com","from":"reports@example.com","subject":"s","text":"t"}`

func TestCLIContract(t *testing.T) {
	t.Parallel()
	db := testdb.NewURL(t)

	r := gw(t, db, "migrate")
	expectCode(t, r, 0, "")
	if r.obj["version"] == nil {
		t.Fatalf("migrate output %s lacks version", r.stdout)
	}

	// Leases.
	r = gw(t, db, "lease", "acquire", "--resource", "report", "--holder", "A", "--ttl", "30s")
	expectCode(t, r, 0, "")
	if r.obj["resource"] != "report" || r.obj["holder"] != "A" || r.obj["epoch"] != 1.0 || r.obj["expires_at"] == nil {
		t.Fatalf("acquire = %s", r.stdout)
	}
	r = gw(t, db, "lease", "acquire", "--resource", "report", "--holder", "B", "--ttl", "30s")
	expectCode(t, r, 4, "lease_held")
	if e := r.obj["error"].(map[string]any); e["holder"] != "A" || e["current_epoch"] != 1.0 {
		t.Fatalf("held error = %s", r.stdout)
	}
	r = gw(t, db, "lease", "renew", "--resource", "report", "--holder", "A", "--epoch", "1", "--ttl", "30s")
	expectCode(t, r, 0, "")
	r = gw(t, db, "lease", "renew", "--resource", "report", "--holder", "A", "--epoch", "7", "--ttl", "30s")
	expectCode(t, r, 3, "stale_epoch")
	if e := r.obj["error"].(map[string]any); e["current_epoch"] != 1.0 {
		t.Fatalf("stale error = %s", r.stdout)
	}
	r = gw(t, db, "lease", "release", "--resource", "report", "--holder", "A", "--epoch", "1")
	expectCode(t, r, 0, "")
	r = gw(t, db, "lease", "acquire", "--resource", "report", "--holder", "B", "--ttl", "30s")
	expectCode(t, r, 0, "")
	if r.obj["epoch"] != 2.0 {
		t.Fatalf("acquire after release = %s; want epoch 2", r.stdout)
	}

	// Epoch advance.
	r = gw(t, db, "epoch", "advance", "--resource", "ext", "--epoch", "41")
	expectCode(t, r, 0, "")
	if r.obj["resource"] != "ext" || r.obj["epoch"] != 41.0 {
		t.Fatalf("advance = %s", r.stdout)
	}
	expectCode(t, gw(t, db, "epoch", "advance", "--resource", "ext", "--epoch", "41"), 0, "")
	r = gw(t, db, "epoch", "advance", "--resource", "ext", "--epoch", "40")
	expectCode(t, r, 3, "stale_epoch")

	// Enqueue.
	r = gw(t, db, "enqueue", "--resource", "report", "--epoch", "2", "--op", "send-1", "--kind", "email", "--payload", cliEmail)
	expectCode(t, r, 0, "")
	id := r.obj["intent_id"]
	if id == nil || r.obj["status"] != "pending" || r.obj["duplicate"] != false {
		t.Fatalf("enqueue = %s", r.stdout)
	}
	r = gw(t, db, "enqueue", "--resource", "report", "--epoch", "2", "--op", "send-1", "--kind", "email", "--payload", cliEmail)
	expectCode(t, r, 0, "")
	if r.obj["intent_id"] != id || r.obj["duplicate"] != true {
		t.Fatalf("retry = %s; want duplicate of %v", r.stdout, id)
	}
	r = gw(t, db, "enqueue", "--resource", "report", "--epoch", "2", "--op", "send-1", "--kind", "email",
		"--payload", strings.Replace(cliEmail, `"t"}`, `"other"}`, 1))
	expectCode(t, r, 5, "conflict")
	r = gw(t, db, "enqueue", "--resource", "report", "--epoch", "1", "--op", "send-2", "--kind", "email", "--payload", cliEmail)
	expectCode(t, r, 3, "stale_epoch")
	if e := r.obj["error"].(map[string]any); e["current_epoch"] != 2.0 || e["supplied_epoch"] != 1.0 {
		t.Fatalf("stale = %s", r.stdout)
	}
	path := filepath.Join(t.TempDir(), "payload.json")
	if err := os.WriteFile(path, []byte(`{"target":"reports/r.txt","content":"hello"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r = gw(t, db, "enqueue", "--resource", "report", "--epoch", "2", "--op", "file-1", "--kind", "file", "--key", "report/2026-12-01", "--payload", "@"+path)
	expectCode(t, r, 0, "")
	fileID := r.obj["intent_id"]

	// Status.
	r = gw(t, db, "status", jsonNum(id))
	expectCode(t, r, 0, "")
	for _, k := range []string{"intent_id", "resource", "epoch", "operation_id", "kind", "idempotency_key", "fence", "status", "attempts", "result", "last_error", "created_at", "updated_at"} {
		if _, ok := r.obj[k]; !ok {
			t.Fatalf("status lacks %q: %s", k, r.stdout)
		}
	}
	if _, ok := r.obj["payload"]; ok {
		t.Fatalf("status shows the payload: %s", r.stdout)
	}
	if r.obj["fence"] != "commit" || r.obj["idempotency_key"] != "report/send-1" || r.obj["status"] != "pending" {
		t.Fatalf("status = %s", r.stdout)
	}
	r = gw(t, db, "status", "--resource", "report", "--op", "file-1")
	expectCode(t, r, 0, "")
	if r.obj["intent_id"] != fileID || r.obj["fence"] != "execute" || r.obj["idempotency_key"] != "report/2026-12-01" {
		t.Fatalf("status by op = %s", r.stdout)
	}
	expectCode(t, gw(t, db, "status", "987654"), 2, "not_found")
	expectCode(t, gw(t, db, "status", "--resource", "report", "--op", "nope"), 2, "not_found")
}

func jsonNum(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Bad input: exit 2, an error naming the field, nothing stored — checked
// even with no database reachable, since validation comes first.
func TestCLIBadInput(t *testing.T) {
	t.Parallel()
	db, _ := migratedDB(t)
	expectInvalidAnyDB(t, db, []invalidArgs{
		{[]string{"enqueue", "--resource", "r", "--epoch", "1", "--op", "o", "--kind", "sms", "--payload", "{}"}, "kind"},
		{[]string{"enqueue", "--resource", "", "--epoch", "1", "--op", "o", "--kind", "email", "--payload", cliEmail}, "resource"},
		{[]string{"enqueue", "--resource", "r", "--epoch", "0", "--op", "o", "--kind", "email", "--payload", cliEmail}, "epoch"},
		{[]string{"enqueue", "--resource", "r", "--epoch", "1", "--kind", "email", "--payload", cliEmail}, "operation_id"},
		{[]string{"enqueue", "--resource", "r", "--epoch", "1", "--op", "o", "--kind", "email", "--payload", "[1]"}, "payload"},
		{[]string{"enqueue", "--resource", "r", "--epoch", "1", "--op", "o", "--kind", "file", "--payload", `{"target":"../x","content":"a"}`}, "payload.target"},
		{[]string{"enqueue", "--resource", "r", "--epoch", "1", "--op", "o", "--kind", "email", "--payload", `{"to":"bad","from":"b@example.com","subject":"s","text":"t"}`}, "payload.to[0]"},
		{[]string{"enqueue", "--resource", "r", "--epoch", "1", "--op", "o", "--kind", "email", "--payload", "@/nonexistent/file.json"}, "payload"},
		{[]string{"enqueue", "--resource", "r", "--epoch", "1", "--op", "o", "--kind", "email", "--fence", "maybe", "--payload", cliEmail}, "fence"},
		{[]string{"enqueue", "--epoch", "x"}, "epoch"},
		{[]string{"lease", "acquire", "--resource", "r", "--ttl", "1s"}, "holder"},
		{[]string{"lease", "acquire", "--resource", "r", "--holder", "h", "--ttl", "0s"}, "ttl"},
		{[]string{"lease", "renew", "--resource", "r", "--holder", "h", "--ttl", "1s"}, "epoch"},
		{[]string{"lease", "steal", "--resource", "r"}, "command"},
		{[]string{"epoch", "advance", "--resource", "r", "--epoch", "-1"}, "epoch"},
		{[]string{"status", "abc"}, "intent_id"},
		{[]string{"status"}, "intent_id"},
		{[]string{"frobnicate"}, "command"},
	})
	r := gw(t, db, "status", "--resource", "r", "--op", "o")
	expectCode(t, r, 2, "not_found")
}

func TestCLIUnreachableDatabase(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"migrate"},
		{"lease", "acquire", "--resource", "r", "--holder", "h"},
		{"enqueue", "--resource", "r", "--epoch", "1", "--op", "o", "--kind", "email", "--payload", cliEmail},
		{"status", "1"},
	} {
		r := gw(t, "postgres://nobody@127.0.0.1:1/none", args...)
		expectCode(t, r, 1, "unavailable")
		if !strings.Contains(r.stderr, "database unreachable") {
			t.Fatalf("%v: stderr %q should name what failed", args, r.stderr)
		}
	}
	r := gw(t, "", "status", "1")
	expectCode(t, r, 2, "invalid_input")
}

// gateway --version prints one JSON object with the build's version and Go
// version, exit 0.
func TestVersion(t *testing.T) {
	t.Parallel()
	r := gw(t, "", "--version")
	expectCode(t, r, 0, "")
	if v, _ := r.obj["version"].(string); v == "" {
		t.Fatalf("no version: %s", r.stdout)
	}
	if g, _ := r.obj["go"].(string); !strings.HasPrefix(g, "go") {
		t.Fatalf("no go version: %s", r.stdout)
	}
	if _, ok := r.obj["commit"]; !ok {
		t.Fatalf("no commit field: %s", r.stdout)
	}
	// An argument after it is bad input naming it, not "unknown command
	// --version".
	r = gw(t, "", "--version", "extra")
	expectInvalid(t, r, "command")
	if !strings.Contains(r.stdout, `takes no arguments, got \"extra\"`) {
		t.Fatalf("--version extra: %s", r.stdout)
	}
}

// gateway run --print-config prints the effective configuration — the
// command line over the environment over the defaults — without
// connecting, and no secret in it.
func TestRunPrintConfig(t *testing.T) {
	t.Parallel()
	r := gwEnv(t, []string{"GATEWAY_SMTP_PASSWORD=hunter2-secret", "GATEWAY_DB_MAX_CONNS=9", "GATEWAY_LOG_LEVEL=warn"},
		"postgres://app:db-secret@db.example.com:5432/app", "run", "--print-config", "--log-level", "debug",
		"--nats-url", "nats://u:nats-secret@127.0.0.1:4222")
	expectCode(t, r, 0, "")
	cfg, _ := r.obj["config"].(map[string]any)
	for k, want := range map[string]string{"db-max-conns": "9", "log-level": "debug", "smtp-password": "(set)", "adapter-concurrency": "256"} {
		if cfg[k] != want {
			t.Errorf("config[%s] = %v, want %q", k, cfg[k], want)
		}
	}
	for _, secret := range []string{"hunter2-secret", "db-secret", "nats-secret"} {
		if strings.Contains(r.stdout+r.stderr, secret) {
			t.Errorf("a secret leaked: %s", r.stdout)
		}
	}
	if u, _ := cfg["database-url"].(string); !strings.Contains(u, "db.example.com") {
		t.Errorf("database-url = %q, want the redacted URL", u)
	}
}
