package cli

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/smtptest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/testkit/testpki"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// `gateway run --admin-addr` serves the admin API and pages: /healthz and
// /readyz (PostgreSQL and the NATS connection) answer 200 without a token,
// the API wants the $GATEWAY_TOKENS bearer, the pages send browsers to the
// login form; SIGTERM still exits 0.
func TestRunAdmin(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	const secret = "op-secret-0123456789abcdef"
	p := newRunEnv(t).run(t, []string{"GATEWAY_TOKENS=ops:operator:" + secret}, "--adapters", "", "--admin-addr", addr)
	base := "http://" + addr

	get := func(path, token string) (int, string, http.Header) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		c := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		res, err := c.Do(req)
		if err != nil {
			return 0, err.Error(), nil
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), res.Header
	}
	pollUntil(t, 30*time.Second, "/readyz to answer 200", func() (bool, string) {
		code, body, _ := get("/readyz", "")
		return code == http.StatusOK, body
	})
	code, body, _ := get("/readyz", "")
	var ready struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil || ready.Checks["postgres"] != "ok" || ready.Checks["nats"] != "ok" {
		t.Fatalf("/readyz = %d %s", code, body)
	}
	if code, body, _ := get("/healthz", ""); code != http.StatusOK {
		t.Fatalf("/healthz = %d %s", code, body)
	}
	if code, _, _ := get("/api/v1/intents", ""); code != http.StatusUnauthorized {
		t.Fatalf("/api/v1/intents without a token = %d, want 401", code)
	}
	if code, body, _ := get("/api/v1/intents", secret); code != http.StatusOK || !strings.Contains(body, `"intents"`) {
		t.Fatalf("/api/v1/intents = %d %s", code, body)
	}
	if code, _, hdr := get("/intents", ""); code != http.StatusSeeOther || !strings.HasPrefix(hdr.Get("Location"), "/login") {
		t.Fatalf("/intents without a session = %d %v, want 303 to /login", code, hdr)
	}
	if code, body, _ := get("/intents", secret); code != http.StatusOK || !strings.Contains(body, "<h1>Intents</h1>") {
		t.Fatalf("/intents = %d %s", code, body)
	}
	if strings.Contains(p.stderr.String(), secret) {
		t.Fatal("the token leaked into the log")
	}
	p.stop(t)
}

// Bad admin flags are exit 2 naming the field, before anything connects;
// no secret is echoed.
func TestRunAdminBadFlags(t *testing.T) {
	t.Parallel()
	badFile := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(badFile, []byte("ops:admin:secret-secret-secret-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runBadFlagCases(t, "secret-secret", []badFlagCase{
		{"all interfaces without tokens", nil, []string{"--admin-addr", "0.0.0.0:8080"}, "admin_addr"},
		{"no host without tokens", nil, []string{"--admin-addr", ":8080"}, "admin_addr"},
		{"host name without tokens", nil, []string{"--admin-addr", "example.com:8080"}, "admin_addr"},
		{"not host:port", []string{"GATEWAY_TOKENS=ops:operator:secret-secret-0123456789"}, []string{"--admin-addr", "8080"}, "admin_addr"},
		{"bad env tokens", []string{"GATEWAY_TOKENS=ops:operator:short"}, []string{"--admin-addr", "127.0.0.1:0"}, "tokens"},
		{"bad tokens file", nil, []string{"--admin-addr", "127.0.0.1:0", "--tokens-file", badFile}, "tokens_file"},
		{"missing tokens file", nil, []string{"--admin-addr", "127.0.0.1:0", "--tokens-file", badFile + ".missing"}, "tokens_file"},
	})
}

// The admin server over TLS (--tls-cert, --tls-key): HTTPS with the CA
// answers, plain HTTP does not; the session cookie is Secure. An address
// that is not loopback without TLS needs --insecure-http (exit 2 naming
// admin_addr otherwise).
func TestRunAdminTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, cert, key, _, _, pool := testpki.Write(t, dir)
	addr := freeAddr(t)
	const secret = "op-secret-0123456789abcdef"
	p := newRunEnv(t).run(t, []string{"GATEWAY_TOKENS=ops:operator:" + secret},
		"--adapters", "", "--admin-addr", addr, "--tls-cert", cert, "--tls-key", key)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	waitHealthz(t, client, "https://"+addr)
	if res, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/healthz"); err == nil {
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP answered 200 on the TLS address")
		}
	}
	form := strings.NewReader("token=" + secret + "&next=/intents")
	req, _ := http.NewRequest("POST", "https://"+addr+"/login", form)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	var secure bool
	for _, c := range res.Cookies() {
		if c.Name == "__Host-fencegate_session" {
			secure = c.Secure && c.HttpOnly && c.SameSite == http.SameSiteStrictMode
		}
	}
	if res.StatusCode != http.StatusSeeOther || !secure {
		t.Fatalf("login over TLS: %d, cookies %v; want 303 and a Secure, HttpOnly, SameSite=Strict session cookie", res.StatusCode, res.Cookies())
	}
	p.stop(t)

	tokens := []string{"GATEWAY_TOKENS=ops:operator:" + secret}
	runBadFlags(t, tokens, []string{"--admin-addr", "0.0.0.0:8080"}, "admin_addr")
	runBadFlags(t, tokens, []string{"--admin-addr", "127.0.0.1:0", "--tls-cert", cert}, "tls_cert")
	runBadFlags(t, tokens, []string{"--admin-addr", "127.0.0.1:0", "--tls-cert", key, "--tls-key", cert}, "tls_cert")
}

// The mail policy through gateway run: without --mail-from-allow the email
// adapter does not run (exit 2 naming mail_from_allow); with it, the admin
// intake refuses a sender, a recipient domain or a recipient count outside
// it (400 naming the field) and stores nothing; an intent outside it that
// reached the outbox another way (gateway enqueue, which knows no policy)
// ends failed with nothing sent; what is sent has --mail-envelope-from as
// its envelope sender, at a real SMTP server.
func TestRunMailPolicy(t *testing.T) {
	t.Parallel()
	runBadFlags(t, nil, []string{"--adapters", "email"}, "mail_from_allow")
	runBadFlags(t, nil, []string{"--adapters", "email", "--mail-from-allow", "<x>"}, "mail_from_allow")
	runBadFlags(t, nil, []string{"--adapters", "email", "--mail-from-allow", "example.com", "--mail-max-recipients", "0"}, "mail_max_recipients")
	runBadFlags(t, nil, []string{"--adapters", "email", "--mail-from-allow", "example.com", "--mail-rcpt-allow", "a@example.com"}, "mail_rcpt_allow")
	runBadFlags(t, nil, []string{"--adapters", "email", "--mail-from-allow", "example.com", "--mail-envelope-from", "not an address"}, "mail_envelope_from")
	// The default adapters (email,file) include email: the policy is
	// required there too.
	runBadFlags(t, nil, nil, "mail_from_allow")
	e := newRunEnv(t)
	smtpSrv := smtptest.NewServer(t)
	addr := freeAddr(t)
	e.run(t, []string{"GATEWAY_MAIL_FROM_ALLOW=reports@example.com"}, "--adapters", "email", "--admin-addr", addr,
		"--smtp-addr", smtpSrv.Addr, "--smtp-starttls", "none", "--poll-interval", "200ms",
		"--mail-rcpt-allow", "example.com,example.org", "--mail-max-recipients", "3", "--mail-envelope-from", "bounces@example.com")
	waitAdmin(t, addr)
	post := func(body string) (int, map[string]any) {
		return postJSON(t, "http://"+addr+"/api/v1/intents", "", body)
	}
	expectCode(t, gw(t, e.db, "epoch", "advance", "--resource", "mail", "--epoch", "1"), 0, "")
	for _, tc := range []struct{ payload, field string }{
		{`{"to":"a@example.com","from":"ceo@example.com","subject":"wire money","text":"now"}`, "payload.from"},
		// A domain entry is not its subdomains, nor a listed address's domain.
		{`{"to":"a@example.com","from":"x@mail.example.com","subject":"s","text":"t"}`, "payload.from"},
		{`{"to":["a@example.com","b@example.org","c@elsewhere.net"],"from":"reports@example.com","subject":"s","text":"t"}`, "payload.to[2]"},
		{`{"to":"a@example.com","cc":"b@sub.example.com","from":"reports@example.com","subject":"s","text":"t"}`, "payload.cc[0]"},
		{`{"to":"a@example.com","bcc":["b@example.com","spy@elsewhere.net"],"from":"reports@example.com","subject":"s","text":"t"}`, "payload.bcc[1]"},
		{`{"to":["a@example.com","b@example.com"],"cc":"c@example.org","bcc":"d@example.org","from":"reports@example.com","subject":"s","text":"t"}`, "payload.to"},
	} {
		code, m := post(`{"resource":"mail","epoch":1,"operation_id":"refused","kind":"email","payload":` + tc.payload + `}`)
		e, _ := m["error"].(map[string]any)
		if code != http.StatusBadRequest || e["field"] != tc.field {
			t.Fatalf("payload %s: %d %v, want 400 naming %s", tc.payload, code, m, tc.field)
		}
	}
	if n := testdb.Int(t, e.pool, `SELECT count(*) FROM fencegate.intents`); n != 0 {
		t.Fatalf("%d intents stored", n)
	}
	// Recipients are counted after dedup (case-insensitive): 3, at the limit.
	code, m := post(`{"resource":"mail","epoch":1,"operation_id":"ok","kind":"email","payload":{"to":["a@example.com","A@EXAMPLE.COM","b@example.com"],"cc":"c@example.org","from":"Reports <REPORTS@example.com>","subject":"report","text":"hi"}}`)
	if code != http.StatusCreated {
		t.Fatalf("an allowed message: %d %v", code, m)
	}
	waitStatus(t, e.db, m["intent_id"], "succeeded")
	msgs := smtpSrv.Messages()
	if len(msgs) != 1 || msgs[0].From != "bounces@example.com" || len(msgs[0].To) != 3 {
		t.Fatalf("messages at the SMTP server %+v, want one from envelope sender bounces@example.com to 3 recipients", msgs)
	}
	if h, err := msgs[0].Header(); err != nil || !strings.Contains(h.Get("From"), "REPORTS@example.com") {
		t.Fatalf("From header %q (%v): the payload's From stays the header's", h.Get("From"), err)
	}
	// gateway enqueue writes to the outbox without the intake's policy: the
	// adapter refuses at execute, permanently, and sends nothing.
	for i, payload := range []string{
		`{"to":"a@example.com","from":"ceo@example.com","subject":"s","text":"t"}`,
		`{"to":"a@example.com","bcc":"spy@elsewhere.net","from":"reports@example.com","subject":"s","text":"t"}`,
		`{"to":["a@example.com","b@example.com","c@example.com","d@example.com"],"from":"reports@example.com","subject":"s","text":"t"}`,
	} {
		id := enqueue(t, e.db, "--resource", "mail", "--epoch", "1", "--op", fmt.Sprintf("cli-%d", i), "--kind", "email", "--payload", payload)
		st := waitStatus(t, e.db, id, "failed")
		if le, _ := st["last_error"].(string); !strings.Contains(le, "mail policy") {
			t.Fatalf("intent %v failed with %v, want the mail policy named", id, st["last_error"])
		}
	}
	if n := len(smtpSrv.Messages()); n != 1 {
		t.Fatalf("%d messages at the SMTP server, want only the allowed one", n)
	}
}
