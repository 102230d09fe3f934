package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// hsValue is a header secret's value: it may reach the receiver only.
const hsValue = "Bearer cli-hs-Zx81qPw4"

// writeSecret writes content to a file of the test's own and returns its
// path.
func writeSecret(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// `gateway run --webhook-header-secret NAME=FILE`, end to end against a
// real HTTP receiver: a payload header {"secret": NAME} is sent with the
// file's content (its final newline trimmed); the admin intake refuses a
// name not given and an inline credential, naming the header; gateway
// enqueue does so where $GATEWAY_WEBHOOK_HEADER_SECRET says the names; the
// value is in no output, log, result or status, and --print-config shows
// the names only.
func TestRunWebhookHeaderSecret(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	rcv := newHeaderReceiver(t)
	host := strings.TrimPrefix(rcv.URL, "http://")
	billing := writeSecret(t, "billing", hsValue+"\n")
	partner := writeSecret(t, "partner", "pt-cli-hs-77\r\n")
	admin := freeAddr(t)
	args := []string{"--adapters", "webhook", "--webhook-allow", host, "--admin-addr", admin, "--poll-interval", "200ms",
		"--webhook-header-secret", "billing-api=" + billing, "--webhook-header-secret", "partner=" + partner}

	// --print-config: the names, not the files or their content.
	var out bytes.Buffer
	pc := &app{stdout: &out, stderr: io.Discard, getenv: func(string) string { return "" }}
	if code := cmdRun(context.Background(), pc, append([]string{"--print-config"}, args...)); code != exitOK {
		t.Fatalf("--print-config: exit %d: %s", code, out.String())
	}
	var cfg struct{ Config map[string]string }
	if err := json.Unmarshal(out.Bytes(), &cfg); err != nil || cfg.Config["webhook-header-secret"] != "billing-api,partner" {
		t.Fatalf("--print-config webhook-header-secret = %q (%v), want the names", cfg.Config["webhook-header-secret"], err)
	}
	if strings.Contains(out.String(), billing) || strings.Contains(out.String(), "cli-hs") {
		t.Fatalf("--print-config shows a secret's file or value: %s", out.String())
	}

	p := e.run(t, nil, args...)
	acquireLease(t, e.db, "billing")
	waitAdmin(t, admin)
	post := func(op, headers string) (int, map[string]any) {
		return postJSON(t, "http://"+admin+"/api/v1/intents", "", `{"resource":"billing","epoch":1,"operation_id":"`+op+`","kind":"webhook",
			"idempotency_key":"`+op+`","payload":{"url":"`+rcv.URL+`/charge","body":{"amount":1},"headers":`+headers+`}}`)
	}
	code, m := post("by-secret", `{"Authorization":{"secret":"billing-api"},"X-Partner-Token":{"secret":"partner"},"X-Tenant":"t1"}`)
	if code != http.StatusCreated {
		t.Fatalf("intake: %d %v", code, m)
	}
	id := m["intent_id"]
	for _, tc := range []struct{ op, headers, field string }{
		{"unknown", `{"Authorization":{"secret":"nope"}}`, "payload.headers.Authorization"},
		{"inline", `{"Authorization":"Bearer cli-inline-cred"}`, "payload.headers.Authorization"},
		{"inline-key", `{"X-Api-Key":"cli-inline-cred"}`, "payload.headers.X-Api-Key"},
	} {
		code, m := post(tc.op, tc.headers)
		body, _ := json.Marshal(m)
		if code != http.StatusBadRequest || m["error"].(map[string]any)["field"] != tc.field || strings.Contains(string(body), "cli-inline-cred") {
			t.Errorf("intake %s: %d %s; want 400 naming %s, the value not echoed", tc.op, code, body, tc.field)
		}
	}
	if n := testdb.Int(t, e.pool, `SELECT count(*) FROM fencegate.intents WHERE operation_id IN ('unknown', 'inline', 'inline-key')`); n != 0 {
		t.Fatalf("%d intents stored for refused enqueues", n)
	}

	// gateway enqueue knows the names from the environment (the files are
	// not read); without it, a name is not checked, an inline credential
	// is refused all the same.
	names := []string{"GATEWAY_WEBHOOK_HEADER_SECRET=billing-api=/nonexistent/billing,partner=/nonexistent/partner"}
	enq := func(env []string, op, headers string) cliResult {
		return gwEnv(t, env, e.db, "enqueue", "--resource", "billing", "--epoch", "1", "--op", op, "--kind", "webhook",
			"--payload", `{"url":"`+rcv.URL+`/charge","headers":`+headers+`}`)
	}
	expectInvalid(t, enq(names, "cli-unknown", `{"X-Partner-Token":{"secret":"nope"}}`), "payload.headers.X-Partner-Token")
	r := enq(nil, "cli-inline", `{"Cookie":"sid=cli-inline-cred"}`)
	expectInvalid(t, r, "payload.headers.Cookie")
	if strings.Contains(r.stdout+r.stderr, "cli-inline-cred") {
		t.Fatalf("gateway enqueue echoes the credential: %s %s", r.stdout, r.stderr)
	}
	cliID := enqueue(t, e.db, "--resource", "billing", "--epoch", "1", "--op", "cli-secret", "--kind", "webhook",
		"--payload", `{"url":"`+rcv.URL+`/charge","headers":{"Authorization":{"secret":"billing-api"}}}`)

	st := waitStatus(t, e.db, id, "succeeded")
	waitStatus(t, e.db, cliID, "succeeded")
	h := rcv.headers("by-secret")
	if len(h) != 1 || h[0].Get("Authorization") != hsValue || h[0].Get("X-Partner-Token") != "pt-cli-hs-77" || h[0].Get("X-Tenant") != "t1" {
		t.Fatalf("the receiver got %d requests; first %v: want the secrets' values, final newlines trimmed", len(h), h)
	}

	// As an intent stored before inline credentials were refused: no
	// rendering shows them.
	if _, err := e.pool.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents
		SET payload = jsonb_set(payload, '{headers}', '{"Authorization":"Bearer cli-stored-cred"}') WHERE intent_id = $1`), int64(id.(float64))); err != nil {
		t.Fatal(err)
	}
	res, err := http.Get("http://" + admin + "/api/v1/intents/" + jsonNum(id))
	if err != nil {
		t.Fatal(err)
	}
	api, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(api), `"Authorization":"(redacted)"`) {
		t.Fatalf("GET intent: %d %s; want the stored Authorization redacted", res.StatusCode, api)
	}
	outputs := map[string]string{"status": gw(t, e.db, "status", jsonNum(id)).stdout, "ls": gw(t, e.db, "ls", "--resource", "billing").stdout,
		"api": string(api), "result": string(mustJSON(t, st))}
	p.stop(t)
	outputs["log"] = p.stderr.String()
	for what, s := range outputs {
		for _, leak := range []string{"cli-hs-Zx81qPw4", "pt-cli-hs-77", "cli-stored-cred", "cli-inline-cred"} {
			if strings.Contains(s, leak) {
				t.Errorf("%s shows %q:\n%s", what, leak, s)
			}
		}
	}
	t.Logf("%d outputs checked for 4 secrets", len(outputs))
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// --webhook-header-secret's bad entries are exit 2 naming
// webhook_header_secret, never echoing a file's content or a value given
// in place of a file.
func TestRunWebhookHeaderSecretBadFlags(t *testing.T) {
	t.Parallel()
	const leak = "hs-bad-Q7c2"
	ok := writeSecret(t, "ok", "v")
	run := func(v string) []string { return []string{"--webhook-allow", "h.example", "--webhook-header-secret", v} }
	runBadFlagCases(t, leak, []badFlagCase{
		{"not NAME=FILE", nil, run("Bearer " + leak), "webhook_header_secret"},
		{"bad name", nil, run("a b=" + ok), "webhook_header_secret"},
		{"name twice", nil, run("a=" + ok + ",a=" + ok), "webhook_header_secret"},
		{"no file", nil, run("a=" + filepath.Join(t.TempDir(), "missing")), "webhook_header_secret"},
		{"empty file", nil, run("a=" + writeSecret(t, "empty", "\n")), "webhook_header_secret"},
		{"CRLF inside", nil, run("a=" + writeSecret(t, "crlf", leak+"\r\nX-Evil: 1\n")), "webhook_header_secret"},
		{"from the environment", []string{"GATEWAY_WEBHOOK_HEADER_SECRET=" + leak}, []string{"--webhook-allow", "h.example"}, "webhook_header_secret"},
	})
}
