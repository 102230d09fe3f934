package cli

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/smtptest"
)

// --key-scope resource through gateway run's intake: two workers scoped to
// their own resources give the same idempotency key; each effect happens
// (the keys stored are "<bytes>:<resource>/<key>"), where with the global scope the
// second would be taken for a duplicate of the first and never happen. A
// key already naming its resource is kept as it is. Bad values are exit 2
// naming key_scope. The tokens file, readable by others here, is warned
// about by name and mode, its tokens never printed.
func TestRunKeyScope(t *testing.T) {
	t.Parallel()
	runBadFlags(t, nil, []string{"--adapters", "", "--key-scope", "tenant"}, "key_scope")
	r := gwEnv(t, []string{"GATEWAY_KEY_SCOPE=tenant"}, "postgres://127.0.0.1:1/none", "enqueue", "--resource", "r", "--epoch", "1",
		"--op", "o", "--kind", "file", "--payload", `{"target":"x","content":"y"}`)
	if e, _ := r.obj["error"].(map[string]any); r.code != exitBadInput || e["field"] != "key_scope" {
		t.Fatalf("GATEWAY_KEY_SCOPE=tenant: exit %d %s, want 2 naming key_scope", r.code, r.stdout)
	}

	e := newRunEnv(t)
	root := t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	const (
		secretA = "worker-a-secret-0123456789abcdef"
		secretB = "worker-b-secret-0123456789abcdef"
	)
	if err := os.WriteFile(tokens, []byte(`[{"name":"job-a","role":"worker","token":"`+secretA+`","resources":["a/*"]},
		{"name":"job-b","role":"worker","token":"`+secretB+`","resources":["b/*"]}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tokens, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := e.run(t, nil, "--adapters", "file", "--file-root", root, "--admin-addr", addr,
		"--tokens-file", tokens, "--key-scope", "resource", "--poll-interval", "200ms")
	waitAdmin(t, addr)
	post := func(token, path, body string) (int, map[string]any) {
		t.Helper()
		return postJSON(t, "http://"+addr+path, token, body)
	}
	for _, c := range []struct{ token, resource, key, target, wantKey string }{
		{secretA, "a/1", "invoice-7", "a.txt", "3:a/1/invoice-7"},
		{secretB, "b/1", "invoice-7", "b.txt", "3:b/1/invoice-7"},
		// Naming another resource's key does not reach it.
		{secretB, "b/2", "3:a/1/invoice-7", "b2.txt", "3:b/2/3:a/1/invoice-7"},
		// A key scoped for its own resource already is kept.
		{secretA, "a/2", "3:a/2/invoice-8", "a2.txt", "3:a/2/invoice-8"},
		// Nested names do not collide: a/4 with key 1/invoice-7 is not
		// a/4/1 with key invoice-7.
		{secretA, "a/4", "1/invoice-7", "a4.txt", "3:a/4/1/invoice-7"},
		{secretA, "a/4/1", "invoice-7", "a41.txt", "5:a/4/1/invoice-7"},
	} {
		code, m := post(c.token, "/api/v1/leases", `{"resource":"`+c.resource+`","holder":"job","ttl_ms":60000}`)
		if code != http.StatusCreated {
			t.Fatalf("lease %s: %d %v", c.resource, code, m)
		}
		body, _ := json.Marshal(map[string]any{"resource": c.resource, "epoch": m["epoch"], "operation_id": "publish",
			"kind": "file", "idempotency_key": c.key, "payload": map[string]string{"target": c.target, "content": c.resource}})
		code, m = post(c.token, "/api/v1/intents", string(body))
		if code != http.StatusCreated || m["idempotency_key"] != c.wantKey {
			t.Fatalf("enqueue %s key %s: %d %v, want 201 with idempotency_key %s", c.resource, c.key, code, m, c.wantKey)
		}
		waitStatus(t, e.db, m["intent_id"], "succeeded")
		if b, err := os.ReadFile(filepath.Join(root, c.target)); err != nil || string(b) != c.resource {
			t.Fatalf("%s: %q, %v; want the effect of %s's intent", c.target, b, err, c.resource)
		}
	}
	logs := p.stderr.String()
	if !strings.Contains(logs, "tokens_file") || !strings.Contains(logs, "0644") {
		t.Errorf("no warning about the group/world-readable tokens file:\n%s", logs)
	}
	if strings.Contains(logs, secretA) || strings.Contains(logs, secretB) {
		t.Fatal("a token leaked into the log")
	}
	p.stop(t)
}

// --smtp-password-file: the password is read from the file (its first
// line) and AUTH succeeds at a real SMTP server that requires it; the file
// readable by others is warned about; the password is never printed. Both
// it and --smtp-password, or a missing or empty file, are exit 2 naming
// smtp_password_file.
func TestRunSMTPPasswordFile(t *testing.T) {
	t.Parallel()
	const password = "smtp-pass-from-file-s3cret"
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "smtp-password")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(pwFile, 0o640); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--adapters", "email", "--mail-from-allow", "example.com"}
	for _, args := range [][]string{
		{"--smtp-password-file", pwFile, "--smtp-password", "other"},
		{"--smtp-password-file", filepath.Join(dir, "missing")},
		{"--smtp-password-file", empty},
	} {
		if out := runBadFlags(t, nil, append(base, args...), "smtp_password_file"); strings.Contains(out, password) {
			t.Fatalf("the password leaked: %s", out)
		}
	}
	if out := runBadFlags(t, []string{"GATEWAY_SMTP_PASSWORD=other"}, append(base, "--smtp-password-file", pwFile), "smtp_password_file"); strings.Contains(out, password) {
		t.Fatalf("the password leaked: %s", out)
	}

	e := newRunEnv(t)
	smtpSrv := smtptest.NewServer(t, smtptest.WithAuth("reports", password))
	p := e.run(t, nil, append(base, "--smtp-addr", smtpSrv.Addr, "--smtp-starttls", "none",
		"--smtp-user", "reports", "--smtp-password-file", pwFile, "--poll-interval", "200ms")...)
	expectCode(t, gw(t, e.db, "epoch", "advance", "--resource", "mail", "--epoch", "1"), 0, "")
	id := enqueue(t, e.db, "--resource", "mail", "--epoch", "1", "--op", "m1", "--kind", "email",
		"--payload", `{"to":"a@example.com","from":"reports@example.com","subject":"s","text":"t"}`)
	waitStatus(t, e.db, id, "succeeded")
	if n := len(smtpSrv.Messages()); n != 1 {
		t.Fatalf("%d messages at the SMTP server, want 1 (sent after AUTH with the file's password)", n)
	}
	logs := p.stderr.String()
	if !strings.Contains(logs, "smtp_password_file") || !strings.Contains(logs, "0640") {
		t.Errorf("no warning about the group-readable password file:\n%s", logs)
	}
	if strings.Contains(logs, password) {
		t.Fatal("the password leaked into the log")
	}
}
