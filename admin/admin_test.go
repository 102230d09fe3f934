package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

const (
	workerSecret   = "worker-secret-0123456789"
	operatorSecret = "operator-secret-0123456789"
)

var testTokens = []Token{
	{Name: "w1", Role: RoleWorker, Secret: workerSecret, Epochs: true},
	{Name: "op1", Role: RoleOperator, Secret: operatorSecret},
}

type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	srv    *Server
	ts     *httptest.Server
	issuer *lease.Issuer
	ob     *outbox.Client
}

func newServer(t testing.TB, pool *pgxpool.Pool, tokens []Token, mod func(*Config)) *Server {
	t.Helper()
	ob := coretest.Outbox(t, pool)
	store := coretest.Store(t, pool)
	cfg := Config{Pool: pool, Outbox: ob, Issuer: coretest.Issuer(pool), Store: store, Tokens: tokens,
		Registry: prometheus.NewRegistry()}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func setup(t *testing.T) *env {
	t.Helper()
	return setupWith(t, testTokens)
}

// setupWith serves, on loopback, a server with tokens (nil: none) on a
// database of the test's own.
func setupWith(t *testing.T, tokens []Token) *env {
	t.Helper()
	t.Parallel()
	pool := testdb.New(t)
	s := newServer(t, pool, tokens, nil)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return &env{t: t, pool: pool, srv: s, ts: ts, issuer: s.cfg.Issuer, ob: s.cfg.Outbox}
}

// atEpochOne advances each resource to epoch 1, the epoch the tests write
// their intents at.
func (e *env) atEpochOne(resources ...string) {
	e.t.Helper()
	for _, res := range resources {
		if _, err := e.issuer.Advance(context.Background(), res, 1); err != nil {
			e.t.Fatal(err)
		}
	}
}

type resp struct {
	code int
	obj  map[string]any
	raw  string
	hdr  http.Header
}

func (r resp) errField(key string) any {
	e, _ := r.obj["error"].(map[string]any)
	return e[key]
}

// do sends a request with a JSON body (none when body is "").
func (e *env) do(method, path, token, body string) resp {
	e.t.Helper()
	return doReq(e.t, e.ts.URL, method, path, token, body, "application/json")
}

func doReq(t testing.TB, base, method, path, token, body, ctype string) resp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" && ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	r := resp{code: res.StatusCode, raw: string(b), hdr: res.Header}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(b, &r.obj); err != nil {
			t.Fatalf("%s %s: body is not a JSON object: %q", method, path, b)
		}
	}
	return r
}

func expect(t *testing.T, r resp, code int, errCode string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("status %d, want %d: %s", r.code, code, r.raw)
	}
	if errCode == "" {
		if _, ok := r.obj["error"]; ok {
			t.Fatalf("unexpected error: %s", r.raw)
		}
		return
	}
	if r.errField("code") != errCode || r.errField("message") == "" {
		t.Fatalf("error = %s, want code %q with a message", r.raw, errCode)
	}
}

func expectField(t *testing.T, r resp, field string) {
	t.Helper()
	expect(t, r, http.StatusBadRequest, r.errField("code").(string))
	if r.errField("field") != field {
		t.Fatalf("error field = %v, want %q: %s", r.errField("field"), field, r.raw)
	}
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	return testdb.Int(e.t, e.pool, sql, args...)
}

func emailIntent(resource string, epoch int64, op string) string {
	return fmt.Sprintf(`{"resource":%q,"epoch":%d,"operation_id":%q,"kind":"email",
		"payload":{"to":"alice@example.com","from":"reports@example.com","subject":"hi","text":"body"}}`, resource, epoch, op)
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

func TestIntakeStatusCodes(t *testing.T) {
	e := setup(t)
	// acquire: 201 new grant, 409 another holder (the same holder again is
	// a new grant too: TestIntakeAcquireIsAlwaysANewEpoch).
	r := e.do("POST", "/api/v1/leases", workerSecret, `{"resource":"report","holder":"a","ttl_ms":60000}`)
	expect(t, r, http.StatusCreated, "")
	if num(r.obj["epoch"]) != 1 || r.obj["holder"] != "a" || r.obj["expires_at"] == nil {
		t.Fatalf("acquire = %s", r.raw)
	}
	r = e.do("POST", "/api/v1/leases", workerSecret, `{"resource":"report","holder":"b","ttl_ms":60000}`)
	expect(t, r, http.StatusConflict, "lease_held")
	if num(r.errField("current_epoch")) != 1 || r.errField("holder") != "a" || r.errField("expires_at") == nil {
		t.Fatalf("lease held body = %s", r.raw)
	}
	expectField(t, e.do("POST", "/api/v1/leases", workerSecret, `{"resource":"report","holder":"a"}`), "ttl_ms")
	expectField(t, e.do("POST", "/api/v1/leases", workerSecret, `{"resource":"","holder":"a","ttl_ms":1000}`), "resource")

	// renew and enqueue with the current epoch.
	r = e.do("POST", "/api/v1/leases/renew", workerSecret, `{"resource":"report","holder":"a","epoch":1,"ttl_ms":60000}`)
	expect(t, r, http.StatusOK, "")
	r = e.do("POST", "/api/v1/intents", workerSecret, emailIntent("report", 1, "op-1"))
	expect(t, r, http.StatusCreated, "")
	id := num(r.obj["intent_id"])
	if id < 1 || r.obj["status"] != "pending" || r.obj["duplicate"] != false || r.obj["fence"] != "commit" {
		t.Fatalf("enqueue = %s", r.raw)
	}
	// duplicate: 200 with the existing intent.
	r = e.do("POST", "/api/v1/intents", workerSecret, emailIntent("report", 1, "op-1"))
	expect(t, r, http.StatusOK, "")
	if num(r.obj["intent_id"]) != id || r.obj["duplicate"] != true {
		t.Fatalf("duplicate = %s", r.raw)
	}
	// same operation id, different content: 422.
	r = e.do("POST", "/api/v1/intents", workerSecret, strings.Replace(emailIntent("report", 1, "op-1"), `"hi"`, `"other"`, 1))
	expect(t, r, http.StatusUnprocessableEntity, "conflict")
	if num(r.errField("intent_id")) != id {
		t.Fatalf("conflict = %s", r.raw)
	}

	// release, then b takes over: a's epoch 1 is stale everywhere.
	expect(t, e.do("POST", "/api/v1/leases/release", workerSecret, `{"resource":"report","holder":"a","epoch":1}`), http.StatusOK, "")
	expect(t, e.do("POST", "/api/v1/leases", workerSecret, `{"resource":"report","holder":"b","ttl_ms":60000}`), http.StatusCreated, "")
	r = e.do("POST", "/api/v1/intents", workerSecret, emailIntent("report", 1, "op-2"))
	expect(t, r, http.StatusConflict, "stale_epoch")
	if num(r.errField("current_epoch")) != 2 || num(r.errField("supplied_epoch")) != 1 {
		t.Fatalf("stale = %s", r.raw)
	}
	r = e.do("POST", "/api/v1/leases/renew", workerSecret, `{"resource":"report","holder":"a","epoch":1,"ttl_ms":60000}`)
	expect(t, r, http.StatusConflict, "stale_epoch")
	if num(r.errField("current_epoch")) != 2 {
		t.Fatalf("stale renew = %s", r.raw)
	}
	if n := e.count(`SELECT count(*) FROM fencegate.intents WHERE operation_id = 'op-2'`); n != 0 {
		t.Fatalf("stale enqueue stored %d rows", n)
	}

	// epochs: 201 advanced, 200 equal, 409 lower.
	r = e.do("POST", "/api/v1/epochs", workerSecret, `{"resource":"ext","epoch":7}`)
	expect(t, r, http.StatusCreated, "")
	if num(r.obj["epoch"]) != 7 || r.obj["advanced"] != true {
		t.Fatalf("advance = %s", r.raw)
	}
	expect(t, e.do("POST", "/api/v1/epochs", workerSecret, `{"resource":"ext","epoch":7}`), http.StatusOK, "")
	r = e.do("POST", "/api/v1/epochs", workerSecret, `{"resource":"ext","epoch":3}`)
	expect(t, r, http.StatusConflict, "stale_epoch")
	if num(r.errField("current_epoch")) != 7 {
		t.Fatalf("lower advance = %s", r.raw)
	}
	expectField(t, e.do("POST", "/api/v1/epochs", workerSecret, `{"resource":"ext","epoch":0}`), "epoch")

	// bad payload: 400 naming the nested field, nothing stored.
	r = e.do("POST", "/api/v1/intents", workerSecret, `{"resource":"ext","epoch":7,"operation_id":"x","kind":"email",
		"payload":{"to":["not an address"],"from":"a@example.com","subject":"s","text":"t"}}`)
	expectField(t, r, "payload.to[0]")
	if r.errField("code") != "invalid_input" {
		t.Fatalf("code = %s", r.raw)
	}
	if n := e.count(`SELECT count(*) FROM fencegate.intents`); n != 1 {
		t.Fatalf("intents = %d, want 1", n)
	}
}

func TestAuth(t *testing.T) {
	e := setup(t)
	r := e.do("GET", "/api/v1/intents", "", "")
	expect(t, r, http.StatusUnauthorized, "unauthorized")
	if !strings.HasPrefix(r.hdr.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("WWW-Authenticate = %q", r.hdr.Get("WWW-Authenticate"))
	}
	expect(t, e.do("GET", "/api/v1/intents", "wrong-token-0123456789", ""), http.StatusUnauthorized, "unauthorized")
	expect(t, e.do("GET", "/api/v1/intents", workerSecret+"x", ""), http.StatusUnauthorized, "unauthorized")
	// roles: worker can't read or act, operator can't use the intake.
	expect(t, e.do("GET", "/api/v1/intents", workerSecret, ""), http.StatusForbidden, "forbidden")
	expect(t, e.do("POST", "/api/v1/intents/1/cancel", workerSecret, ""), http.StatusForbidden, "forbidden")
	expect(t, e.do("GET", "/metrics", workerSecret, ""), http.StatusForbidden, "forbidden")
	expect(t, e.do("POST", "/api/v1/leases", operatorSecret, `{"resource":"r","holder":"h","ttl_ms":1000}`), http.StatusForbidden, "forbidden")
	expect(t, e.do("POST", "/api/v1/intents", operatorSecret, emailIntent("r", 1, "o")), http.StatusForbidden, "forbidden")
	expect(t, e.do("GET", "/api/v1/intents", operatorSecret, ""), http.StatusOK, "")
	// no token for health and readiness.
	expect(t, e.do("GET", "/healthz", "", ""), http.StatusOK, "")
	r = e.do("GET", "/readyz", "", "")
	expect(t, r, http.StatusOK, "")
	// the scheme is case-insensitive; other schemes are not bearer tokens.
	req, _ := http.NewRequest("GET", e.ts.URL+"/api/v1/intents", nil)
	req.Header.Set("Authorization", "bearer "+operatorSecret)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("lower-case bearer: %d", res.StatusCode)
	}
	req.Header.Set("Authorization", "Basic "+operatorSecret)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 401 {
		t.Fatalf("basic: %d", res.StatusCode)
	}
	// metrics: operator only, with the API's own counters.
	r = e.do("GET", "/metrics", operatorSecret, "")
	if r.code != 200 || !strings.Contains(r.raw, "fencegate_admin_requests_total") {
		t.Fatalf("metrics: %d %.300s", r.code, r.raw)
	}
}

// TestAuthComparesEveryToken checks the constant-time path: every
// configured token is compared, whether the first, the last or none
// matches, and only through the injected constant-time compare.
func TestAuthComparesEveryToken(t *testing.T) {
	tokens := []Token{
		{Name: "a", Role: RoleWorker, Secret: "aaaaaaaaaaaaaaaaaaaa"},
		{Name: "b", Role: RoleOperator, Secret: "bbbbbbbbbbbbbbbbbbbb"},
		{Name: "c", Role: RoleWorker, Secret: "cccccccccccccccccccc"},
	}
	a := newAuthenticator(tokens)
	calls := 0
	a.compare = func(x, y []byte) int {
		calls++
		if len(x) != len(y) {
			t.Fatalf("compared %d with %d bytes: lengths must not depend on the secret", len(x), len(y))
		}
		return subtleCompare(x, y)
	}
	for _, tc := range []struct {
		presented string
		name      string
		ok        bool
	}{
		{"aaaaaaaaaaaaaaaaaaaa", "a", true},
		{"cccccccccccccccccccc", "c", true},
		{"bbbbbbbbbbbbbbbbbbbb", "b", true},
		{"nope", "", false},
		{"", "", false},
		{"aaaaaaaaaaaaaaaaaaaaa", "", false},
	} {
		calls = 0
		p, ok := a.lookup(tc.presented)
		if ok != tc.ok || p.name != tc.name {
			t.Errorf("lookup(%q) = %v, %v; want %q, %v", tc.presented, p.name, ok, tc.name, tc.ok)
		}
		if calls != len(tokens) {
			t.Errorf("lookup(%q) compared %d tokens, want all %d", tc.presented, calls, len(tokens))
		}
	}
}

func TestParseTokens(t *testing.T) {
	lines := "# ops\nalice:operator:" + operatorSecret + "\n\nci:worker:" + workerSecret + ":with:colons\n"
	got, err := ParseTokens(lines)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "alice" || got[0].Role != RoleOperator || got[0].Secret != operatorSecret || got[1].Secret != workerSecret+":with:colons" {
		t.Fatalf("lines: %+v", got)
	}
	got, err = ParseTokens(`[{"name":"alice","role":"operator","token":"` + operatorSecret + `"}]`)
	if err != nil || len(got) != 1 || got[0].Name != "alice" {
		t.Fatalf("json: %+v %v", got, err)
	}
	env := map[string]string{EnvTokens: "a:worker:" + workerSecret + ",b:operator:" + operatorSecret}
	got, err = TokensFromEnv(func(k string) string { return env[k] })
	if err != nil || len(got) != 2 || got[1].Role != RoleOperator {
		t.Fatalf("env: %+v %v", got, err)
	}
	for _, bad := range []string{
		"a:admin:" + workerSecret, // unknown role
		"a:worker:short",          // too short
		"nocolons",
		"a:worker:" + workerSecret + "\nb:worker:" + workerSecret, // same secret twice
		`[{"name":"a","role":"worker","token":"` + workerSecret + `","x":1}]`,
	} {
		if _, err := ParseTokens(bad); err == nil {
			t.Errorf("ParseTokens(%q) accepted", bad)
		} else if strings.Contains(err.Error(), "short") && strings.Contains(bad, "short") && strings.Contains(err.Error(), ":short") {
			t.Errorf("error echoes the secret: %v", err)
		}
	}
}

func TestBadInputStoresNothing(t *testing.T) {
	e := setup(t)
	expect(t, e.do("POST", "/api/v1/epochs", workerSecret, `{"resource":"r","epoch":1}`), http.StatusCreated, "")
	valid := emailIntent("r", 1, "op")
	big := `{"resource":"r","epoch":1,"operation_id":"op","kind":"email","payload":{"to":"a@example.com","from":"b@example.com","subject":"s","text":"` +
		strings.Repeat("x", DefaultMaxBodyBytes) + `"}}`
	checked := 0
	for _, tc := range []struct {
		name, body, ctype, field string
		code                     string
	}{
		{"malformed", `{"resource":`, "application/json", "body", "invalid_input"},
		{"not an object", `[1,2]`, "application/json", "body", "invalid_input"},
		{"empty", ``, "application/json", "body", "invalid_input"},
		{"unknown field", strings.Replace(valid, `"kind"`, `"sneaky":1,"kind"`, 1), "application/json", "sneaky", "invalid_input"},
		{"field name case", strings.Replace(valid, `"epoch"`, `"Epoch"`, 1), "application/json", "Epoch", "invalid_input"},
		{"invalid UTF-8 in payload", strings.Replace(valid, `"body"`, "\"\x92\"", 1), "application/json", "payload", "invalid_input"},
		{"trailing data", valid + `{}`, "application/json", "body", "invalid_input"},
		{"trailing garbage", valid + ` x`, "application/json", "body", "invalid_input"},
		{"wrong content type", valid, "text/plain", "content_type", "invalid_input"},
		{"no content type", valid, "", "content_type", "invalid_input"},
		{"epoch as string", strings.Replace(valid, `"epoch":1`, `"epoch":"1"`, 1), "application/json", "epoch", "invalid_input"},
		{"epoch fractional", strings.Replace(valid, `"epoch":1`, `"epoch":1.5`, 1), "application/json", "epoch", "invalid_input"},
		{"epoch huge", strings.Replace(valid, `"epoch":1`, `"epoch":1e40`, 1), "application/json", "epoch", "invalid_input"},
		{"epoch missing", strings.Replace(valid, `"epoch":1,`, ``, 1), "application/json", "epoch", "invalid_input"},
		{"no resource", strings.Replace(valid, `"resource":"r",`, ``, 1), "application/json", "resource", "invalid_input"},
		{"unknown kind", strings.Replace(valid, `"email"`, `"fax"`, 1), "application/json", "kind", "invalid_input"},
		{"bad fence", strings.Replace(valid, `"kind"`, `"fence":"later","kind"`, 1), "application/json", "fence", "invalid_input"},
		{"payload not object", strings.Replace(valid, `"payload":{`, `"payload":["x",{`, 1) + `]`, "application/json", "body", "invalid_input"},
		{"payload null", `{"resource":"r","epoch":1,"operation_id":"op","kind":"email","payload":null}`, "application/json", "payload", "invalid_input"},
		{"no subject", strings.Replace(valid, `"subject":"hi",`, ``, 1), "application/json", "payload.subject", "invalid_input"},
		{"file target escapes", `{"resource":"r","epoch":1,"operation_id":"op","kind":"file","payload":{"target":"../etc/passwd","content":"x"}}`, "application/json", "payload.target", "invalid_input"},
		// The payload's fields are its kind's own, spelt exactly: a
		// misspelt "Bcc" would be dropped and the message sent without it.
		{"email payload unknown field", strings.Replace(valid, `"to":`, `"Bcc":"boss@example.com","to":`, 1), "application/json", "payload.Bcc", "invalid_input"},
		{"email payload field name case", strings.Replace(valid, `"to":`, `"To":`, 1), "application/json", "payload.To", "invalid_input"},
		{"file payload unknown field", `{"resource":"r","epoch":1,"operation_id":"op","kind":"file","payload":{"target":"a.txt","content":"x","extra":true}}`, "application/json", "payload.extra", "invalid_input"},
		{"NUL in payload", strings.Replace(valid, `"body"`, `"a\u0000b"`, 1), "application/json", "payload", "invalid_input"},
		{"too large", big, "application/json", "body", "body_too_large"},
		// One reading only: a body a proxy or an audit log could read
		// otherwise than the server (the first of two names, or null).
		{"null", `null`, "application/json", "body", "invalid_input"},
		{"a name twice", strings.Replace(valid, `"resource":"r"`, `"resource":"r","resource":"s"`, 1), "application/json", "resource", "invalid_input"},
		{"a payload name twice", strings.Replace(valid, `"to":"alice@example.com"`, `"to":"alice@example.com","to":"eve@example.com"`, 1), "application/json", "payload.to", "invalid_input"},
	} {
		checked++
		t.Run(tc.name, func(t *testing.T) {
			r := doReq(t, e.ts.URL, "POST", "/api/v1/intents", workerSecret, tc.body, tc.ctype)
			if tc.body == "" {
				// doReq sends no content type without a body; send one.
				req, _ := http.NewRequest("POST", e.ts.URL+"/api/v1/intents", bytes.NewReader(nil))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+workerSecret)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				r = resp{code: res.StatusCode, raw: string(b)}
				_ = json.Unmarshal(b, &r.obj)
			}
			expect(t, r, http.StatusBadRequest, tc.code)
			if r.errField("field") != tc.field {
				t.Fatalf("field = %v, want %q: %s", r.errField("field"), tc.field, r.raw)
			}
		})
	}
	t.Logf("%d bad bodies checked", checked)
	if checked == 0 {
		t.Fatal("no bad body checked")
	}
	if n := e.count(`SELECT count(*) FROM fencegate.intents`); n != 0 {
		t.Fatalf("bad input stored %d intents", n)
	}
	// The valid body is accepted, so the cases above failed for their flaw.
	expect(t, e.do("POST", "/api/v1/intents", workerSecret, valid), http.StatusCreated, "")
}

func TestReads(t *testing.T) {
	e := setup(t)
	expect(t, e.do("POST", "/api/v1/epochs", workerSecret, `{"resource":"r","epoch":1}`), http.StatusCreated, "")
	r := e.do("POST", "/api/v1/intents", workerSecret, emailIntent("r", 1, "op"))
	expect(t, r, http.StatusCreated, "")
	id := num(r.obj["intent_id"])

	r = e.do("GET", fmt.Sprintf("/api/v1/intents/%d", id), operatorSecret, "")
	expect(t, r, http.StatusOK, "")
	if num(r.obj["intent_id"]) != id || r.obj["payload"] == nil || r.obj["status"] != "pending" {
		t.Fatalf("get = %s", r.raw)
	}
	if h, ok := r.obj["history"].([]any); !ok || len(h) != 0 {
		t.Fatalf("history = %v", r.obj["history"])
	}
	if tl, ok := r.obj["timeline"].([]any); !ok || len(tl) != 1 || tl[0].(map[string]any)["what"] != "created" {
		t.Fatalf("timeline = %v", r.obj["timeline"])
	}
	expect(t, e.do("GET", "/api/v1/intents/999999", operatorSecret, ""), http.StatusNotFound, "not_found")
	expectField(t, e.do("GET", "/api/v1/intents/abc", operatorSecret, ""), "intent_id")
	expectField(t, e.do("GET", "/api/v1/intents/-1", operatorSecret, ""), "intent_id")
	expectField(t, e.do("POST", "/api/v1/intents/abc/cancel", operatorSecret, ""), "intent_id")

	r = e.do("GET", "/api/v1/resources/r", operatorSecret, "")
	expect(t, r, http.StatusOK, "")
	counts := r.obj["counts"].(map[string]any)
	if num(r.obj["epoch"]) != 1 || num(counts["pending"]) != 1 || num(counts["failed"]) != 0 || num(r.obj["total"]) != 1 {
		t.Fatalf("resource = %s", r.raw)
	}
	expect(t, e.do("GET", "/api/v1/resources/nobody", operatorSecret, ""), http.StatusNotFound, "not_found")
	expect(t, e.do("GET", "/api/v1/nothing", operatorSecret, ""), http.StatusNotFound, "not_found")
	r = e.do("DELETE", "/api/v1/intents/1", operatorSecret, "")
	expect(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
}

func TestPagination(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.atEpochOne("a", "b")
	enqueue := func(res, op string) int64 {
		r, err := e.ob.Enqueue(ctx, outbox.Intent{Resource: res, Epoch: 1, OperationID: op, Kind: "file",
			Payload: json.RawMessage(`{"target":"x.txt","content":"x"}`)})
		if err != nil {
			t.Fatal(err)
		}
		return r.IntentID
	}
	var all, allA []int64
	for i := range 23 {
		res := "a"
		if i%3 == 0 {
			res = "b"
		}
		id := enqueue(res, fmt.Sprint("op-", i))
		all = append([]int64{id}, all...)
		if res == "a" {
			allA = append([]int64{id}, allA...)
		}
	}
	page := func(query string) ([]int64, string) {
		r := e.do("GET", "/api/v1/intents?"+query, operatorSecret, "")
		expect(t, r, http.StatusOK, "")
		var ids []int64
		for _, it := range r.obj["intents"].([]any) {
			m := it.(map[string]any)
			if _, ok := m["payload"]; ok {
				t.Fatalf("list includes payloads: %v", m)
			}
			ids = append(ids, num(m["intent_id"]))
		}
		next, _ := r.obj["next_cursor"].(string)
		if _, ok := r.obj["next_cursor"]; !ok {
			t.Fatalf("no next_cursor key: %s", r.raw)
		}
		return ids, next
	}
	walk := func(filter string, limit int, during func(int)) []int64 {
		var got []int64
		cursor := ""
		for n := 0; ; n++ {
			ids, next := page(fmt.Sprintf("%slimit=%d&cursor=%s", filter, limit, cursor))
			if len(ids) > limit {
				t.Fatalf("page of %d > limit %d", len(ids), limit)
			}
			got = append(got, ids...)
			if next == "" {
				return got
			}
			if during != nil {
				during(n)
			}
			cursor = next
		}
	}
	// New intents committed while paging don't shift pages: no duplicates,
	// no gaps among the intents that existed when paging began.
	late := 0
	got := walk("", 5, func(n int) { enqueue("a", fmt.Sprint("late-", n)); late++ })
	if fmt.Sprint(got) != fmt.Sprint(all) {
		t.Fatalf("pages = %v\nwant    %v", got, all)
	}
	got = walk("resource=a&status=pending&kind=file&", 4, nil)
	if late == 0 || len(got) != len(allA)+late || fmt.Sprint(got[late:]) != fmt.Sprint(allA) {
		t.Fatalf("resource a pages = %v, want %d late + %v", got, late, allA)
	}
	if ids, next := page("kind=email"); len(ids) != 0 || next != "" {
		t.Fatalf("kind=email: %v %q", ids, next)
	}
	// default limit 50
	if ids, _ := page(""); len(ids) != 23+late {
		t.Fatalf("default page = %d", len(ids))
	}
	for _, tc := range []struct{ query, field string }{
		{"limit=0", "limit"}, {"limit=501", "limit"}, {"limit=x", "limit"}, {"limit=-3", "limit"},
		{"status=done", "status"}, {"cursor=abc", "cursor"}, {"cursor=0", "cursor"}, {"sort=asc", "sort"},
		// Text PostgreSQL cannot take: 400 naming it, not the server's
		// encoding error as a 500.
		{"kind=%00", "kind"}, {"resource=%ff", "resource"}, {"resource=a%00", "resource"},
		// A parameter given twice: which one counts is not guessed.
		{"status=failed&status=unknown", "status"}, {"limit=1&limit=5", "limit"},
	} {
		expectField(t, e.do("GET", "/api/v1/intents?"+tc.query, operatorSecret, ""), tc.field)
	}
	// The message quotes the limit given, 0 included.
	if msg, _ := e.do("GET", "/api/v1/intents?limit=0", operatorSecret, "").errField("message").(string); !strings.Contains(msg, `got "0"`) {
		t.Errorf("limit=0: message %q, want it to quote the 0 given", msg)
	}
	expect(t, e.do("GET", "/api/v1/intents?limit=500", operatorSecret, ""), http.StatusOK, "")
}

// setStatus forces an intent's status, as the adapter runtime would, with
// the effect the runtime records with it: an unknown outcome makes it
// possible, a success done.
func (e *env) setStatus(id int64, status outbox.Status, lastError string) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET status = $2, last_error = nullif($3, ''),
		completed_at = CASE WHEN $2 IN ('failed', 'unknown', 'succeeded') THEN now() END,
		effect = CASE WHEN $2 = 'succeeded' THEN 'done' WHEN $2 = 'unknown' AND effect = 'none' THEN 'possible' ELSE effect END
		WHERE intent_id = $1`),
		id, string(status), lastError); err != nil {
		e.t.Fatal(err)
	}
}

// putKey writes the intent's idempotency key in the given state.
func (e *env) putKey(id int64, state idempotency.State, status outbox.Status) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), testdb.SQL(`
		INSERT INTO fencegate.idempotency_keys (kind, idempotency_key, fingerprint, state, owner_intent_id, first_intent_id,
		                              locked_until, status, completed_at)
		SELECT kind, idempotency_key, $2, $3, intent_id, intent_id,
		       CASE WHEN $3 = 'started' THEN now() + interval '1 hour' END, nullif($4, ''),
		       CASE WHEN $3 = 'completed' THEN now() END
		FROM fencegate.intents WHERE intent_id = $1`), id, e.fingerprint(id), string(state), string(status))
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) fingerprint(id int64) string {
	e.t.Helper()
	rec, err := e.ob.Get(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return idempotency.Fingerprint(rec.Kind, rec.Payload)
}

func (e *env) key(id int64) *idempotency.Key {
	e.t.Helper()
	return coretest.Key(e.t, e.ob, e.srv.cfg.Store, id)
}

func TestActions(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.atEpochOne("r")
	newIntent := func(op string) int64 {
		r := e.do("POST", "/api/v1/intents", workerSecret, emailIntent("r", 1, op))
		expect(t, r, http.StatusCreated, "")
		return num(r.obj["intent_id"])
	}
	act := func(id int64, action, body string) resp {
		return e.do("POST", fmt.Sprintf("/api/v1/intents/%d/%s", id, action), operatorSecret, body)
	}

	// retry of an unknown intent whose key is held: its effect is possible
	// (the attempt's outcome was lost), so without force the retry is 409
	// invalid_state naming effect, and nothing changes.
	unknown := newIntent("unknown")
	e.setStatus(unknown, outbox.StatusUnknown, "smtp: connection reset after DATA")
	e.putKey(unknown, idempotency.StateHeld, outbox.StatusUnknown)
	events := e.count(`SELECT count(*) FROM fencegate.intent_events`)
	expectEffectRefused(t, act(unknown, "retry", `{"note":"looked at the mailbox, nothing there"}`), "retry", "unknown")
	if k := e.key(unknown); e.status(unknown) != outbox.StatusUnknown || k == nil || k.State != idempotency.StateHeld ||
		e.count(`SELECT count(*) FROM fencegate.intent_events`) != events {
		t.Fatalf("a refused retry changed something: status %s, key %+v", e.status(unknown), k)
	}
	// With force: pending, the held key deleted (the next attempt executes
	// afresh instead of recovering), the effect still possible.
	r := act(unknown, "retry", `{"note":"looked at the mailbox, nothing there","force":true}`)
	expect(t, r, http.StatusOK, "")
	if r.obj["status"] != "pending" || r.obj["from_status"] != "unknown" || r.obj["key"] != "deleted" || r.obj["forced"] != true || r.obj["effect"] != "possible" {
		t.Fatalf("forced retry = %s", r.raw)
	}
	if k := e.key(unknown); k != nil {
		t.Fatalf("key after a forced retry = %+v, want none", k)
	}
	if d := e.do("GET", fmt.Sprintf("/api/v1/intents/%d", unknown), operatorSecret, ""); d.obj["last_error"] != nil || d.obj["completed_at"] != nil || d.obj["effect"] != "possible" {
		t.Fatalf("intent after retry = %s", d.raw)
	}
	// the next attempt executes.
	rec, _ := e.ob.Get(ctx, unknown)
	dec, err := e.srv.cfg.Store.Begin(ctx, rec.Kind, rec.IdempotencyKey, e.fingerprint(unknown), unknown)
	if err != nil || dec.Outcome != idempotency.OutcomeExecute {
		t.Fatalf("Begin after a forced retry = %+v, %v", dec, err)
	}

	// retry of an intent whose effect is none, its key held: the key is
	// unheld (started, expired lock, new token → the next attempt
	// recovers: it looks the outcome up first).
	unheld := newIntent("unheld")
	e.setStatus(unheld, outbox.StatusFailed, "smtp: connection reset after DATA")
	e.putKey(unheld, idempotency.StateHeld, outbox.StatusUnknown)
	heldToken := e.key(unheld).Token
	r = act(unheld, "retry", "")
	expect(t, r, http.StatusOK, "")
	if r.obj["key"] != "unheld" || r.obj["effect"] != "none" {
		t.Fatalf("retry = %s", r.raw)
	}
	if _, ok := r.obj["forced"]; ok {
		t.Fatalf("a retry of an intent whose effect is none says forced: %s", r.raw)
	}
	if k := e.key(unheld); k.State != idempotency.StateStarted || k.Token == heldToken || k.LockedUntil.After(time.Now().Add(time.Minute)) {
		t.Fatalf("key after retry = %+v", k)
	}
	rec2, _ := e.ob.Get(ctx, unheld)
	if d, err := e.srv.cfg.Store.Begin(ctx, rec2.Kind, rec2.IdempotencyKey, e.fingerprint(unheld), unheld); err != nil || d.Outcome != idempotency.OutcomeRecover {
		t.Fatalf("Begin after retry = %+v, %v", d, err)
	}

	// retry of a failed intent whose key completed as failed: key deleted.
	failed := newIntent("failed")
	e.setStatus(failed, outbox.StatusFailed, "550 mailbox unavailable")
	e.putKey(failed, idempotency.StateCompleted, outbox.StatusFailed)
	r = act(failed, "retry", "")
	expect(t, r, http.StatusOK, "")
	if r.obj["key"] != "deleted" || e.key(failed) != nil {
		t.Fatalf("retry failed = %s, key %+v", r.raw, e.key(failed))
	}
	// a succeeded key is kept: the effect happened.
	done := newIntent("done")
	e.setStatus(done, outbox.StatusFailed, "x")
	e.putKey(done, idempotency.StateCompleted, outbox.StatusSucceeded)
	r = act(done, "retry", "")
	expect(t, r, http.StatusOK, "")
	if _, ok := r.obj["key"]; ok || e.key(done) == nil {
		t.Fatalf("retry with succeeded key = %s", r.raw)
	}

	// actions the status does not allow: 409 invalid_state with the status.
	r = act(unknown, "retry", "") // pending now
	expect(t, r, http.StatusConflict, "invalid_state")
	if r.errField("status") != "pending" {
		t.Fatalf("invalid_state body = %s", r.raw)
	}
	r = act(unknown, "resolve", `{"outcome":"succeeded"}`)
	expect(t, r, http.StatusConflict, "invalid_state")

	// cancel of the forced retry's intent, pending with its attempt in
	// flight and its effect possible: 409 naming effect (a cancelled
	// intent would read as an effect that did not happen). Once that
	// attempt ends held unknown, still 409 naming effect, and force does
	// not apply to a cancel (400 naming force): resolve records what the
	// operator found.
	expectEffectRefused(t, act(unknown, "cancel", ""), "cancel", "pending")
	if _, err := e.srv.cfg.Store.Complete(ctx, idempotency.Completion{Kind: rec.Kind, Key: rec.IdempotencyKey,
		Token: dec.Token, IntentID: unknown, Status: outbox.StatusUnknown, Error: "still no answer"}); err != nil {
		t.Fatal(err)
	}
	expectEffectRefused(t, act(unknown, "cancel", `{"note":"customer asked"}`), "cancel", "unknown")
	expectField(t, act(unknown, "cancel", `{"note":"customer asked","force":true}`), "force")
	expectField(t, act(unknown, "resolve", `{"outcome":"failed","force":true}`), "force")
	expectField(t, act(unknown, "retry", `{"force":"yes"}`), "force")
	expectField(t, act(unknown, "retry", `{"force":true,"note":"`+strings.Repeat("n", operator.MaxNoteLen-len(operator.ForcedNote)-2+1)+`"}`), "note")
	// Resolved failed, its effect stays possible: a retry still needs
	// force, a cancel is still refused.
	r = act(unknown, "resolve", `{"outcome":"failed","note":"customer asked"}`)
	expect(t, r, http.StatusOK, "")
	if r.obj["status"] != "failed" || r.obj["effect"] != "possible" {
		t.Fatalf("resolve failed = %s", r.raw)
	}
	expectEffectRefused(t, act(unknown, "retry", ""), "retry", "failed")
	expectEffectRefused(t, act(unknown, "cancel", ""), "cancel", "failed")

	// resolve unknown → succeeded completes the held key: later intents
	// with the same key get Done.
	res := newIntent("resolve")
	e.setStatus(res, outbox.StatusUnknown, "timeout")
	e.putKey(res, idempotency.StateHeld, outbox.StatusUnknown)
	expectField(t, act(res, "resolve", `{}`), "outcome")
	expectField(t, act(res, "resolve", `{"outcome":"pending"}`), "outcome")
	expectField(t, act(res, "resolve", ""), "body")
	expectField(t, act(res, "resolve", `{"outcome":"succeeded","extra":1}`), "extra")
	expectField(t, act(res, "cancel", `{"outcome":"succeeded"}`), "outcome")
	expectField(t, act(res, "resolve", `{"outcome":"succeeded","note":"`+strings.Repeat("n", operator.MaxNoteLen+1)+`"}`), "note")
	r = act(res, "resolve", `{"outcome":"succeeded","note":"found it in the sent folder"}`)
	expect(t, r, http.StatusOK, "")
	if r.obj["status"] != "succeeded" || r.obj["key"] != "completed" || r.obj["effect"] != "done" {
		t.Fatalf("resolve = %s", r.raw)
	}
	if k := e.key(res); k.State != idempotency.StateCompleted || k.Status != outbox.StatusSucceeded {
		t.Fatalf("key after resolve = %+v", k)
	}
	rec, _ = e.ob.Get(ctx, res)
	dec, err = e.srv.cfg.Store.Begin(ctx, rec.Kind, rec.IdempotencyKey, e.fingerprint(res), unknown+1000)
	if err != nil || dec.Outcome != idempotency.OutcomeDone || dec.Status != outbox.StatusSucceeded {
		t.Fatalf("Begin after resolve = %+v, %v", dec, err)
	}
	expect(t, act(999999, "cancel", ""), http.StatusNotFound, "not_found")

	// history: every action with actor, statuses, note, last_error kept.
	d := e.do("GET", fmt.Sprintf("/api/v1/intents/%d", unknown), operatorSecret, "")
	expect(t, d, http.StatusOK, "")
	hist := d.obj["history"].([]any)
	if len(hist) != 2 {
		t.Fatalf("history = %v", hist)
	}
	h0, h1 := hist[0].(map[string]any), hist[1].(map[string]any)
	if h0["action"] != "retry" || h0["actor"] != "op1" || h0["from_status"] != "unknown" || h0["to_status"] != "pending" ||
		h0["note"] != operator.ForcedNote+"; looked at the mailbox, nothing there" || h0["last_error"] != "smtp: connection reset after DATA" {
		t.Fatalf("history[0] = %v", h0)
	}
	if h1["action"] != "resolve" || h1["to_status"] != "failed" || h1["note"] != "customer asked" {
		t.Fatalf("history[1] = %v", h1)
	}
	if tl := d.obj["timeline"].([]any); len(tl) < 3 {
		t.Fatalf("timeline = %v", tl)
	}
	// failed attempts of actions wrote no events.
	if n := e.count(`SELECT count(*) FROM fencegate.intent_events`); n != 6 {
		t.Fatalf("events = %d, want 6", n)
	}
}

// expectEffectRefused checks r is the refusal of action on an intent of
// status whose effect is possible: 409 invalid_state naming the field
// effect, saying that the effect may have happened and what the operator
// can do.
func expectEffectRefused(t *testing.T, r resp, action string, status outbox.Status) {
	t.Helper()
	expect(t, r, http.StatusConflict, "invalid_state")
	if r.errField("field") != "effect" || r.errField("effect") != "possible" || r.errField("status") != string(status) || r.errField("action") != action {
		t.Fatalf("refusal = %s, want field effect, effect possible, status %s, action %s", r.raw, status, action)
	}
	msg, _ := r.errField("message").(string)
	want := []string{"may have happened"}
	switch {
	case action == "retry":
		want = append(want, "retry with force to accept a second effect")
	case status == outbox.StatusFailed:
		want = append(want, "force does not apply", "it stays failed")
	default:
		want = append(want, "force does not apply", "resolve the intent with what you found")
	}
	if status == outbox.StatusUnknown && action == "retry" {
		want = append(want, "resolve the intent with what you found")
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Fatalf("message %q does not say %q", msg, w)
		}
	}
}

func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestUnavailable(t *testing.T) {
	t.Parallel()
	s := newServer(t, unreachablePool(t), testTokens, func(c *Config) {
		c.NATSReady = func() error { return errors.New("nats: no servers available") }
	})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	e := &env{t: t, ts: ts}
	for _, tc := range []struct{ method, path, token, body string }{
		{"POST", "/api/v1/intents", workerSecret, emailIntent("r", 1, "op")},
		{"POST", "/api/v1/leases", workerSecret, `{"resource":"r","holder":"h","ttl_ms":1000}`},
		{"POST", "/api/v1/epochs", workerSecret, `{"resource":"r","epoch":2}`},
		{"GET", "/api/v1/intents", operatorSecret, ""},
		{"GET", "/api/v1/intents/1", operatorSecret, ""},
		{"GET", "/api/v1/resources/r", operatorSecret, ""},
		{"POST", "/api/v1/intents/1/cancel", operatorSecret, ""},
	} {
		expect(t, e.do(tc.method, tc.path, tc.token, tc.body), http.StatusServiceUnavailable, "unavailable")
	}
	// bad input is still 400: it is checked before the database.
	expectField(t, e.do("POST", "/api/v1/intents", workerSecret, `{}`), "resource")
	r := e.do("GET", "/readyz", "", "")
	if r.code != http.StatusServiceUnavailable {
		t.Fatalf("readyz = %d %s", r.code, r.raw)
	}
	checks := r.obj["checks"].(map[string]any)
	if !strings.HasPrefix(checks["postgres"].(string), "unavailable") || !strings.HasPrefix(checks["nats"].(string), "unavailable") {
		t.Fatalf("readyz = %s", r.raw)
	}
	expect(t, e.do("GET", "/healthz", "", ""), http.StatusOK, "")
}

func TestReadyzNames(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	natsErr := errors.New("disconnected")
	s := newServer(t, pool, testTokens, func(c *Config) { c.NATSReady = func() error { return natsErr } })
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	r := doReq(t, ts.URL, "GET", "/readyz", "", "", "")
	checks := r.obj["checks"].(map[string]any)
	if r.code != 503 || checks["postgres"] != "ok" || checks["nats"] != "unavailable: disconnected" {
		t.Fatalf("readyz = %d %s", r.code, r.raw)
	}
	natsErr = nil
	if r := doReq(t, ts.URL, "GET", "/readyz", "", "", ""); r.code != 200 {
		t.Fatalf("readyz = %d %s", r.code, r.raw)
	}
}

func TestLoopbackRule(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	open := newServer(t, pool, nil, nil)
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:0", "example.com:0"} {
		if ln, err := open.Listen(addr); !errors.Is(err, ErrNoTokensNonLoopback) {
			if ln != nil {
				ln.Close()
			}
			t.Errorf("Listen(%q) without tokens = %v, want ErrNoTokensNonLoopback", addr, err)
		}
	}
	if err := open.Serve(context.Background(), "0.0.0.0:0"); !errors.Is(err, ErrNoTokensNonLoopback) {
		t.Errorf("Serve(0.0.0.0) without tokens = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := open.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- open.ServeListener(ctx, ln) }()
	base := "http://" + ln.Addr().String()
	// Without tokens everything is allowed, as "anonymous".
	r := doReq(t, base, "POST", "/api/v1/epochs", "", `{"resource":"r","epoch":1}`, "application/json")
	if r.code != 201 {
		t.Fatalf("anonymous advance = %d %s", r.code, r.raw)
	}
	r = doReq(t, base, "POST", "/api/v1/intents", "", emailIntent("r", 1, "op"), "application/json")
	id := num(r.obj["intent_id"])
	r = doReq(t, base, "POST", fmt.Sprintf("/api/v1/intents/%d/cancel", id), "", "{}", "application/json")
	if r.code != 200 {
		t.Fatalf("anonymous cancel = %d %s", r.code, r.raw)
	}
	hist, err := open.op.History(context.Background(), id)
	if err != nil || len(hist) != 1 || hist[0].Actor != "anonymous" {
		t.Fatalf("history = %+v %v", hist, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}

	// With tokens any address may be bound.
	secured := newServer(t, pool, testTokens, nil)
	ln, err = secured.Listen("0.0.0.0:0")
	if err != nil {
		t.Fatalf("Listen(0.0.0.0) with tokens: %v", err)
	}
	ln.Close()
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without a pool accepted")
	}
	pool := testdb.New(t)
	ob := coretest.Outbox(t, pool)
	base := Config{Pool: pool, Outbox: ob, Issuer: coretest.Issuer(pool)}
	bad := base
	refused := 0
	for name, tokens := range map[string][]Token{
		"a bad role":      {{Name: "x", Role: "root", Secret: workerSecret}},
		"a weak secret":   {{Name: "x", Role: RoleWorker, Secret: "short"}},
		"a secret twice":  {{Name: "x", Role: RoleWorker, Secret: workerSecret}, {Name: "y", Role: RoleOperator, Secret: workerSecret}},
		"a bad resource":  {{Name: "x", Role: RoleWorker, Secret: workerSecret, Resources: []string{"a*b*"}}},
		"a bad principal": {{Name: "x", Role: RoleWorker, Secret: workerSecret, Principal: "Not A Name"}},
		"a name with ':'": {{Name: "x:y", Role: RoleWorker, Secret: workerSecret}},
		"an empty kind":   {{Name: "x", Role: RoleWorker, Secret: workerSecret, Kinds: []string{""}}},
		"a spaced secret": {{Name: "x", Role: RoleWorker, Secret: workerSecret + " x"}},
	} {
		bad.Tokens = tokens
		_, err := New(bad)
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != "Tokens" {
			t.Errorf("New with %s: %v, want an InvalidError naming Tokens", name, err)
		} else if strings.Contains(err.Error(), workerSecret) {
			t.Errorf("New with %s: the error shows the secret: %v", name, err)
		} else {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("no bad token list was refused")
	}
	t.Logf("%d bad token lists refused, naming Tokens; the secret in none of the errors", refused)
	bad = base
	for field, mutate := range map[string]func(*Config){
		"MaxBodyBytes":      func(c *Config) { c.MaxBodyBytes = 10 },
		"AuthFailureLimit":  func(c *Config) { c.AuthFailureLimit = -1 },
		"AuthFailureWindow": func(c *Config) { c.AuthFailureWindow = -time.Second },
		"TLSCertFile":       func(c *Config) { c.TLSKeyFile = "key.pem" },
		"Pool":              func(c *Config) { c.Pool = nil },
	} {
		bad = base
		mutate(&bad)
		var inv *fenceerr.InvalidError
		if _, err := New(bad); !errors.As(err, &inv) || inv.Field != field {
			t.Errorf("New with a bad %s: %v, want an InvalidError naming it", field, err)
		}
	}
	// a smaller body limit applies.
	small := newServer(t, pool, testTokens, func(c *Config) { c.MaxBodyBytes = 100 })
	ts := httptest.NewServer(small.Handler())
	t.Cleanup(ts.Close)
	r := doReq(t, ts.URL, "POST", "/api/v1/intents", workerSecret, emailIntent("r", 1, "op"), "application/json")
	if r.code != 400 || r.errField("code") != "body_too_large" || r.errField("field") != "body" {
		t.Fatalf("over limit = %d %s", r.code, r.raw)
	}
}

func subtleCompare(a, b []byte) int {
	if bytes.Equal(a, b) {
		return 1
	}
	return 0
}

// Without tokens, the API answers only to a loopback Host: a DNS-rebinding
// page (Host: attacker.example resolving to 127.0.0.1) is refused.
func TestNoTokensRefusesForeignHost(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	s := newServer(t, pool, nil, nil)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	for host, want := range map[string]int{"attacker.example": http.StatusMisdirectedRequest, "localhost": http.StatusOK, "": http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/api/v1/intents", nil)
		if host != "" {
			req.Host = host
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("Host %q: status %d, want %d", host, res.StatusCode, want)
		}
	}
}

// No CSRF through the API: without a token, a state-changing request
// without Content-Type: application/json — an empty form POST any web
// page can send — is refused (400 naming content_type) and changes
// nothing; the same with the JSON content type works.
func TestAPIRefusesCrossSiteRequests(t *testing.T) {
	e := setupNoTokens(t)
	if _, err := e.issuer.Advance(context.Background(), "reports", 1); err != nil {
		t.Fatal(err)
	}
	id := e.seedIntent("", "reports", "csrf", outbox.StatusPending, "")
	path := fmt.Sprintf("/api/v1/intents/%d/cancel", id)
	for _, ct := range []string{"", "application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"} {
		req, _ := http.NewRequest("POST", e.ts.URL+path, nil)
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]any
		_ = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || body["error"].(map[string]any)["field"] != "content_type" {
			t.Errorf("cancel with Content-Type %q: %d %v, want 400 naming content_type", ct, res.StatusCode, body)
		}
	}
	if st := e.status(id); st != outbox.StatusPending {
		t.Fatalf("a refused cross-site cancel changed the intent: %s", st)
	}
	req, _ := http.NewRequest("POST", e.ts.URL+path, nil)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || e.status(id) != outbox.StatusCancelled {
		t.Fatalf("cancel with application/json: %d, status %s; want 200 and cancelled", res.StatusCode, e.status(id))
	}
}

// Scoped tokens: a worker token confined to resources and kinds, without
// epochs, and an operator token confined to resources. Inside the scope
// everything works; outside it, every intake route and operator read and
// action is 403 naming what was refused, and nothing is stored.
func TestTokenScopes(t *testing.T) {
	t.Parallel()
	const (
		scopedW  = "scoped-worker-secret-0123456789"
		scopedOp = "scoped-operator-secret-0123456"
	)
	toks, err := ParseTokens(`[{"name":"reports-job","role":"worker","token":"` + scopedW + `","resources":["reports/*","billing/run"],"kinds":["email"]},
		{"name":"reports-ops","role":"operator","token":"` + scopedOp + `","resources":["reports/*"]},
		{"name":"lock-service","role":"worker","token":"` + workerSecret + `","epochs":true}]`)
	if err != nil {
		t.Fatal(err)
	}
	pool := testdb.New(t)
	s := newServer(t, pool, toks, nil)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	do := func(method, path, token, body string) resp {
		return doReq(t, ts.URL, method, path, token, body, "application/json")
	}
	forbid := func(r resp, field string) {
		t.Helper()
		if r.code != http.StatusForbidden || r.errField("field") != field {
			t.Errorf("%d %s, want 403 naming %s", r.code, r.raw, field)
		}
	}
	count := func() int {
		var n int
		if err := pool.QueryRow(context.Background(), testdb.SQL(`SELECT count(*) FROM fencegate.intents`)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Inside the scope.
	r := do("POST", "/api/v1/leases", scopedW, `{"resource":"reports/daily","holder":"job","ttl_ms":60000}`)
	expect(t, r, http.StatusCreated, "")
	epoch := num(r.obj["epoch"])
	r = do("POST", "/api/v1/intents", scopedW, emailIntent("reports/daily", epoch, "mail-1"))
	expect(t, r, http.StatusCreated, "")
	id := num(r.obj["intent_id"])

	// Outside it: another resource, another kind, an advance.
	forbid(do("POST", "/api/v1/leases", scopedW, `{"resource":"payroll","holder":"job","ttl_ms":60000}`), "resource")
	forbid(do("POST", "/api/v1/leases/renew", scopedW, `{"resource":"payroll","holder":"job","epoch":1,"ttl_ms":60000}`), "resource")
	forbid(do("POST", "/api/v1/leases/release", scopedW, `{"resource":"payroll","holder":"job","epoch":1}`), "resource")
	forbid(do("POST", "/api/v1/intents", scopedW, emailIntent("payroll", 1, "mail-2")), "resource")
	forbid(do("POST", "/api/v1/intents", scopedW, `{"resource":"reports/daily","epoch":`+fmt.Sprint(epoch)+`,"operation_id":"f","kind":"file","payload":{"target":"x","content":"y"}}`), "kind")
	forbid(do("POST", "/api/v1/epochs", scopedW, `{"resource":"reports/daily","epoch":99}`), "epochs")
	if n := count(); n != 1 {
		t.Errorf("%d intents stored, want the 1 inside the scope", n)
	}
	// The lock service's token may advance.
	expect(t, do("POST", "/api/v1/epochs", workerSecret, `{"resource":"payroll","epoch":5}`), http.StatusCreated, "")

	// The scoped operator: its resources only.
	expect(t, do("GET", fmt.Sprintf("/api/v1/intents/%d", int64(id)), scopedOp, ""), http.StatusOK, "")
	expect(t, do("GET", "/api/v1/intents?resource=reports/daily", scopedOp, ""), http.StatusOK, "")
	forbid(do("GET", "/api/v1/intents", scopedOp, ""), "resource")
	forbid(do("GET", "/api/v1/intents?resource=payroll", scopedOp, ""), "resource")
	forbid(do("GET", "/api/v1/resources/payroll", scopedOp, ""), "resource")
	forbid(do("GET", "/api/v1/resources/payroll/epochs", scopedOp, ""), "resource")
	r = do("POST", "/api/v1/intents", workerSecret, emailIntent("payroll", 5, "pay-1"))
	expect(t, r, http.StatusCreated, "")
	payID := int64(num(r.obj["intent_id"]))
	forbid(do("POST", fmt.Sprintf("/api/v1/intents/%d/cancel", payID), scopedOp, "{}"), "resource")
	// An intent asked for by id does not tell a scoped operator the
	// resource it is of (nor, so, which resources have intents).
	for _, r := range []resp{do("GET", fmt.Sprintf("/api/v1/intents/%d", payID), scopedOp, ""),
		do("POST", fmt.Sprintf("/api/v1/intents/%d/cancel", payID), scopedOp, "{}")} {
		forbid(r, "resource")
		if strings.Contains(r.raw, "payroll") {
			t.Errorf("a scoped operator's refusal names the intent's resource: %s", r.raw)
		}
	}

	// The pages apply the same scope (the operator's bearer header here;
	// a session carries the token's scope too).
	pc := newPageClient(t, ts.URL)
	pc.header.Set("Authorization", "Bearer "+scopedOp)
	pc.expect(pc.do("GET", "/intents", nil), http.StatusForbidden, "filter by a resource")
	pc.expect(pc.do("GET", "/intents?resource=reports/daily", nil), http.StatusOK, fmt.Sprintf(`href="/intents/%d"`, int64(id)))
	pc.expect(pc.do("GET", "/intents?resource=payroll", nil), http.StatusForbidden, "payroll")
	pc.expect(pc.do("GET", fmt.Sprintf("/intents/%d", int64(id)), nil), http.StatusOK, "reports/daily")
	if r := pc.do("GET", fmt.Sprintf("/intents/%d", payID), nil); r.code != http.StatusForbidden || strings.Contains(r.body, "pay-1") || strings.Contains(r.body, "payroll") {
		t.Errorf("another resource's intent page: %d, want 403 without its content:\n%s", r.code, r.body)
	}
	pc.expect(pc.do("GET", "/resources/payroll", nil), http.StatusForbidden)
	pc.expect(pc.do("GET", "/resources/reports%2Fdaily", nil), http.StatusOK)
	pc.expect(pc.do("POST", fmt.Sprintf("/intents/%d/cancel", payID), url.Values{"note": {"x"}}), http.StatusForbidden)
	if rec, err := s.cfg.Outbox.Get(context.Background(), payID); err != nil || rec.Status != outbox.StatusPending {
		t.Errorf("the page's cancel outside the scope: %v %v, want the intent still pending", rec, err)
	}
	expect(t, do("POST", fmt.Sprintf("/api/v1/intents/%d/cancel", int64(id)), scopedOp, "{}"), http.StatusOK, "")

	// The line format carries the same scope.
	lt, err := ParseTokens("job:worker:" + scopedW + ":resources=reports/*;billing/run:kinds=email:epochs=false")
	if err != nil || lt[0].Secret != scopedW || strings.Join(lt[0].Resources, ",") != "reports/*,billing/run" || strings.Join(lt[0].Kinds, ",") != "email" || lt[0].Epochs {
		t.Errorf("line format: %+v %v", lt, err)
	}
}

// GET /api/v1/intents/{id}?wait= answers when the intent reaches a final
// status (here cancelled by an operator meanwhile), long before the wait
// ends; a bad or too long wait is 400 naming wait.
func TestGetIntentWaits(t *testing.T) {
	e := setup(t)
	if _, err := e.issuer.Advance(context.Background(), "reports", 1); err != nil {
		t.Fatal(err)
	}
	id := e.seedIntent(workerSecret, "reports", "wait", outbox.StatusPending, "")
	path := fmt.Sprintf("/api/v1/intents/%d", id)
	expectField(t, e.do("GET", path+"?wait=forever", operatorSecret, ""), "wait")
	expectField(t, e.do("GET", path+"?wait=61s", operatorSecret, ""), "wait")
	expectField(t, e.do("GET", path+"?wiat=1s", operatorSecret, ""), "wiat")
	got := make(chan resp, 1)
	start := time.Now()
	go func() { got <- doReq(t, e.ts.URL, "GET", path+"?wait=30s", operatorSecret, "", "") }()
	// The long poll is under way (its listener LISTENs) before the cancel.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN `+testdb.PGSchema().OutcomesChannel()+`'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the long poll never listened")
		}
		time.Sleep(10 * time.Millisecond)
	}
	expect(t, e.do("POST", path+"/cancel", operatorSecret, "{}"), http.StatusOK, "")
	r := <-got
	if r.code != http.StatusOK || r.obj["status"] != "cancelled" || time.Since(start) > 10*time.Second {
		t.Fatalf("long poll: %d %v after %s; want 200 cancelled, soon", r.code, r.obj["status"], time.Since(start))
	}
}

// Bulk actions by filter: a dry run counts and changes nothing; the real
// run retries exactly the matching intents (status, kind, resource prefix,
// time range), each recorded in its history with the actor; bad filters
// are 400 naming the field.
func TestBulkActions(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.atEpochOne("reports/a", "reports/b", "billing")
	var match, other []int64
	for i := range 3 {
		match = append(match, e.seedIntent(workerSecret, "reports/a", fmt.Sprintf("m%d", i), outbox.StatusFailed, "550"))
	}
	match = append(match, e.seedIntent(workerSecret, "reports/b", "m3", outbox.StatusFailed, "550"))
	other = append(other, e.seedIntent(workerSecret, "billing", "o1", outbox.StatusFailed, "550"))     // another resource
	other = append(other, e.seedIntent(workerSecret, "reports/a", "o2", outbox.StatusUnknown, "lost")) // another status
	old := e.seedIntent(workerSecret, "reports/a", "o3", outbox.StatusFailed, "550")                   // too old
	other = append(other, old)
	if _, err := e.pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.intents SET updated_at = now() - interval '3 hours' WHERE intent_id = $1`), old); err != nil {
		t.Fatal(err)
	}
	body := `{"action":"retry","status":"failed","kind":"email","resource_prefix":"reports/","since":"2h","note":"mailbox fixed"`
	r := e.do("POST", "/api/v1/intents/bulk", operatorSecret, body+`,"dry_run":true}`)
	expect(t, r, http.StatusOK, "")
	if r.obj["matched"] != 4.0 || r.obj["applied"] != 0.0 || r.obj["dry_run"] != true {
		t.Fatalf("dry run: %s", r.raw)
	}
	for _, id := range match {
		if st := e.status(id); st != outbox.StatusFailed {
			t.Fatalf("the dry run changed intent %d to %s", id, st)
		}
	}
	r = e.do("POST", "/api/v1/intents/bulk", operatorSecret, body+`,"dry_run":false}`)
	expect(t, r, http.StatusOK, "")
	if r.obj["matched"] != 4.0 || r.obj["applied"] != 4.0 {
		t.Fatalf("bulk retry: %s", r.raw)
	}
	for _, id := range match {
		if st := e.status(id); st != outbox.StatusPending {
			t.Errorf("intent %d is %s after the bulk retry, want pending", id, st)
		}
		if n := e.count(`SELECT count(*) FROM fencegate.intent_events WHERE intent_id = $1 AND actor = 'op1' AND action = 'retry'`, id); n != 1 {
			t.Errorf("intent %d: %d retry events by op1, want 1", id, n)
		}
	}
	for _, id := range other {
		if st := e.status(id); st == outbox.StatusPending {
			t.Errorf("intent %d outside the filter was retried", id)
		}
	}
	for field, b := range map[string]string{
		"status":  `{"action":"retry","dry_run":true}`,
		"action":  `{"action":"explode","status":"failed","dry_run":true}`,
		"since":   `{"action":"retry","status":"failed","since":"yesterday","dry_run":true}`,
		"outcome": `{"action":"resolve","status":"unknown"}`,
	} {
		expectField(t, e.do("POST", "/api/v1/intents/bulk", operatorSecret, b), field)
	}
	// A dry run refuses the outcome the run refuses.
	dryRuns := []string{
		`{"action":"resolve","status":"unknown","outcome":"bogus","dry_run":true}`,
		`{"action":"retry","status":"failed","outcome":"succeeded","dry_run":true}`,
		`{"action":"cancel","status":"failed","outcome":"failed","dry_run":true}`,
	}
	for _, b := range dryRuns {
		expectField(t, e.do("POST", "/api/v1/intents/bulk", operatorSecret, b), "outcome")
	}
	if len(dryRuns) == 0 {
		t.Fatal("no dry run checked")
	}
	t.Logf("%d dry runs with a bad outcome refused", len(dryRuns))
	expect(t, e.do("POST", "/api/v1/intents/bulk", workerSecret, body+`}`), http.StatusForbidden, "forbidden")
}

// Who asked is recorded: the token's name on an intent enqueued through
// the API (shown by GET, the intent page and gateway status) and on the
// grants it made; nothing for an intent enqueued otherwise.
func TestPrincipalRecorded(t *testing.T) {
	e := setup(t)
	r := e.do("POST", "/api/v1/leases", workerSecret, `{"resource":"reports","holder":"job","ttl_ms":60000}`)
	expect(t, r, http.StatusCreated, "")
	r = e.do("POST", "/api/v1/intents", workerSecret, emailIntent("reports", num(r.obj["epoch"]), "p1"))
	expect(t, r, http.StatusCreated, "")
	id := int64(num(r.obj["intent_id"]))
	r = e.do("GET", fmt.Sprintf("/api/v1/intents/%d", id), operatorSecret, "")
	if r.obj["principal"] != "w1" {
		t.Errorf("intent principal %v, want w1: %s", r.obj["principal"], r.raw)
	}
	expect(t, e.do("POST", "/api/v1/epochs", workerSecret, `{"resource":"reports","epoch":7}`), http.StatusCreated, "")
	r = e.do("GET", "/api/v1/resources/reports/epochs", operatorSecret, "")
	grants, _ := r.obj["grants"].([]any)
	if len(grants) != 2 {
		t.Fatalf("grants %s", r.raw)
	}
	for _, g := range grants {
		if g.(map[string]any)["principal"] != "w1" {
			t.Errorf("grant %v: want principal w1", g)
		}
	}
	// Enqueued in Go (as a worker library does): no principal.
	res, err := e.ob.Enqueue(context.Background(), outbox.Intent{Resource: "reports", Epoch: 7, OperationID: "go", Kind: "email",
		Payload: []byte(`{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := e.ob.Get(context.Background(), res.IntentID); err != nil || rec.Principal != "" {
		t.Errorf("a Go enqueue: principal %q %v, want none", rec.Principal, err)
	}
}

// A path under /api/ that is not in canonical form (dot segments, a double
// slash) is a JSON 404 not_found, with or without a token, for every
// method: Go's mux would answer a 307 with an HTML body before the token
// is checked, and http-api.md promises JSON errors under /api/v1. Pages
// keep the mux's redirect (a browser follows it).
func TestUncleanAPIPathsAnswerJSON(t *testing.T) {
	e := setup(t)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	checked := 0
	for _, c := range []struct{ method, path string }{
		{"GET", "/api/v1/resources/a/../b"},
		{"GET", "/api/v1//intents"},
		{"GET", "/api/v1/./intents"},
		{"POST", "/api/v1/intents/1/../1/retry"},
		{"POST", "/api/v1/leases/acquire/.."},
	} {
		for _, token := range []string{"", operatorSecret} {
			req, err := http.NewRequest(c.method, e.ts.URL+c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			res, err := noFollow.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			var got struct {
				Error struct{ Code string } `json:"error"`
			}
			if res.StatusCode != http.StatusNotFound || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") ||
				json.Unmarshal(body, &got) != nil || got.Error.Code != "not_found" {
				t.Errorf("%s %s (token %v) = %d %s %q; want 404 JSON not_found", c.method, c.path, token != "",
					res.StatusCode, res.Header.Get("Content-Type"), body)
				continue
			}
			checked++
		}
	}
	// Percent-encoded, a resource named ".." or "a//b" is one segment, in
	// canonical form, and found.
	e.atEpochOne("..", "a//b")
	for _, p := range []string{"/api/v1/resources/%2E%2E", "/api/v1/resources/a%2F%2Fb"} {
		expect(t, e.do("GET", p, operatorSecret, ""), http.StatusOK, "")
	}
	// A page's unclean path still redirects to its canonical form.
	res, err := noFollow.Get(e.ts.URL + "/intents/../intents")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMovedPermanently && res.StatusCode != http.StatusTemporaryRedirect {
		t.Errorf("GET /intents/../intents = %d; want the mux's redirect", res.StatusCode)
	}
	t.Logf("%d of 10 unclean API requests answered 404 JSON", checked)
	if checked != 10 {
		t.Fatalf("%d of 10 unclean API requests answered 404 JSON", checked)
	}
}
