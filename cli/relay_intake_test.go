package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// A process that serves the intake without running the adapters (the
// relay of deploy/kubernetes: `run --adapters ""` with the deployment's
// shared settings) applies the intake rules their flags give, from the
// command line or the environment: a webhook to a host off
// --webhook-allow, a sender off --mail-from-allow, a target outside
// --file-allow or a dotfile, a bucket off --s3-bucket/--s3-allow is 400
// naming the field, nothing stored; what they allow is taken. It stored
// them, and the adapters' process failed them at execute. Without such
// flags the kinds' own rules only: the adapters' process judges.
func TestRelayIntakeAppliesTheAdaptersRules(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	admin, bare := freeAddr(t), freeAddr(t)
	p := e.run(t, []string{"GATEWAY_MAIL_FROM_ALLOW=reports@example.com", "GATEWAY_FILE_ALLOW=reports/**"},
		"--adapters", "", "--admin-addr", admin, "--webhook-allow", "hooks.example.com",
		"--s3-bucket", "fg-reports", "--s3-allow", "fg-archive", "--poll-interval", "200ms")
	e.run(t, nil, "--adapters", "", "--admin-addr", bare, "--poll-interval", "200ms")
	epoch := acquireLease(t, e.db, "report")
	waitAdmin(t, admin)
	waitAdmin(t, bare)
	n := 0
	post := func(addr, kind string, payload map[string]any) (int, map[string]any) {
		n++
		p, _ := json.Marshal(payload)
		return postJSON(t, "http://"+addr+"/api/v1/intents", "",
			fmt.Sprintf(`{"resource":"report","epoch":%s,"operation_id":"op-%d","kind":%q,"payload":%s}`, epoch, n, kind, p))
	}
	mail := func(from string) map[string]any {
		return map[string]any{"to": "alice@example.com", "from": from, "subject": "s", "text": "t"}
	}
	refused := []struct {
		kind    string
		payload map[string]any
		field   string
	}{
		{"webhook", map[string]any{"url": "https://evil.example.com/x"}, "payload.url"},
		{"email", mail("ceo@example.com"), "payload.from"},
		{"file", map[string]any{"target": "secrets/x.txt", "content": "x"}, "payload.target"},
		{"file", map[string]any{"target": "reports/.hidden", "content": "x"}, "payload.target"},
		{"s3", map[string]any{"bucket": "fg-elsewhere", "key": "k", "content": "x"}, "payload.bucket"},
	}
	for _, c := range refused {
		code, m := post(admin, c.kind, c.payload)
		errObj, _ := m["error"].(map[string]any)
		if code != http.StatusBadRequest || errObj["field"] != c.field {
			t.Errorf("relay intake, %s %v: %d %v; want 400 naming %s", c.kind, c.payload, code, m, c.field)
		}
	}
	if got := testdb.Int(t, e.pool, `SELECT count(*) FROM fencegate.intents`); got != 0 {
		t.Fatalf("%d intents stored by refused enqueues", got)
	}
	allowed := []struct {
		kind    string
		payload map[string]any
	}{
		{"webhook", map[string]any{"url": "https://hooks.example.com/x"}},
		{"email", mail("reports@example.com")},
		{"file", map[string]any{"target": "reports/x.txt", "content": "x"}},
		{"s3", map[string]any{"bucket": "fg-archive", "key": "k", "content": "x"}},
	}
	for _, c := range allowed {
		if code, m := post(admin, c.kind, c.payload); code != http.StatusCreated {
			t.Errorf("relay intake, allowed %s %v: %d %v; want 201", c.kind, c.payload, code, m)
		}
	}
	// A process given none of the adapters' flags: the kinds' own rules.
	for _, c := range refused[:3] {
		if code, m := post(bare, c.kind, c.payload); code != http.StatusCreated {
			t.Errorf("intake without the adapters' flags, %s %v: %d %v; want 201 (judged at execute)", c.kind, c.payload, code, m)
		}
	}
	t.Logf("%d refused and %d allowed by the relay's intake, %d taken without the flags", len(refused), len(allowed), 3)
	// The running line spells the query mode as its flag does.
	pollUntil(t, 30*time.Second, "the running line", func() (bool, string) {
		s := p.stderr.String()
		return strings.Contains(s, "gateway: running"), s
	})
	if s := p.stderr.String(); !strings.Contains(s, "database_query_mode=cache_statement") {
		t.Errorf("the running line does not spell the query mode as --database-query-mode does: %s", s)
	}
}
