package admin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// pageClient is a cookie-keeping browser stand-in that does not follow
// redirects.
type pageClient struct {
	t       *testing.T
	base    string
	cookies map[string]*http.Cookie
	header  http.Header
}

type pageResp struct {
	code int
	body string
	hdr  http.Header
}

func newPageClient(t *testing.T, base string) *pageClient {
	return &pageClient{t: t, base: base, cookies: map[string]*http.Cookie{}, header: http.Header{}}
}

func (c *pageClient) do(method, path string, form url.Values) pageResp {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	for _, ck := range c.cookies {
		req.AddCookie(ck)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, ck := range res.Cookies() {
		if ck.MaxAge < 0 {
			delete(c.cookies, ck.Name)
		} else {
			c.cookies[ck.Name] = ck
		}
	}
	return pageResp{code: res.StatusCode, body: string(b), hdr: res.Header}
}

func (c *pageClient) expect(r pageResp, code int, contains ...string) {
	c.t.Helper()
	if r.code != code {
		c.t.Fatalf("status %d, want %d; body:\n%s", r.code, code, r.body)
	}
	for _, s := range contains {
		if !strings.Contains(r.body, s) {
			c.t.Fatalf("page does not contain %q:\n%s", s, r.body)
		}
	}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no csrf field on the page:\n%s", body)
	}
	return m[1]
}

// seedIntent enqueues an email intent on resource (epoch 1) through the
// API and sets its status.
func (e *env) seedIntent(token, resource, op string, status outbox.Status, lastError string) int64 {
	e.t.Helper()
	r := e.do("POST", "/api/v1/intents", token, emailIntent(resource, 1, op))
	if r.code != http.StatusCreated {
		e.t.Fatalf("enqueue: %d %s", r.code, r.raw)
	}
	id := num(r.obj["intent_id"])
	if status != outbox.StatusPending {
		e.setStatus(id, status, lastError)
	}
	return id
}

// With tokens: pages redirect to the login form; a worker token or a wrong
// one does not sign in; an operator token sets an HttpOnly SameSite=Strict
// cookie; actions need the CSRF token and a same-origin request; the
// actor is the token's name; logout clears the cookie.
func TestPagesLoginCookie(t *testing.T) {
	e := setup(t)
	e.atEpochOne("reports")
	failed := e.seedIntent(workerSecret, "reports", "a", outbox.StatusFailed, "550 mailbox unavailable")
	c := newPageClient(t, e.ts.URL)
	intentPath := fmt.Sprintf("/intents/%d", failed)

	r := c.do("GET", intentPath, nil)
	if r.code != http.StatusSeeOther || r.hdr.Get("Location") != "/login?next="+url.QueryEscape(intentPath) {
		t.Fatalf("unauthenticated GET = %d Location %q", r.code, r.hdr.Get("Location"))
	}
	c.expect(c.do("GET", "/login?next="+url.QueryEscape(intentPath), nil), http.StatusOK, `name="token"`, `value="`+intentPath+`"`)
	// An unknown token and a worker's get one answer (TestLoginOneAnswer).
	c.expect(c.do("POST", "/login", url.Values{"token": {"not-a-token-at-all-0000"}, "next": {intentPath}}), http.StatusUnauthorized, "valid operator token")
	c.expect(c.do("POST", "/login", url.Values{"token": {workerSecret}}), http.StatusUnauthorized, "valid operator token")
	if len(c.cookies) != 0 {
		t.Fatalf("a refused login set cookies: %v", c.cookies)
	}
	// Login CSRF: a cross-site form does not sign the browser in.
	c.header.Set("Sec-Fetch-Site", "cross-site")
	c.expect(c.do("POST", "/login", url.Values{"token": {operatorSecret}}), http.StatusForbidden)
	c.header.Del("Sec-Fetch-Site")

	r = c.do("POST", "/login", url.Values{"token": {operatorSecret}, "next": {intentPath}})
	if r.code != http.StatusSeeOther || r.hdr.Get("Location") != intentPath {
		t.Fatalf("login = %d Location %q: %s", r.code, r.hdr.Get("Location"), r.body)
	}
	ck := c.cookies[sessionCookie]
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.MaxAge <= 0 {
		t.Fatalf("session cookie = %+v", ck)
	}
	// The cookie is a session id, not the long-lived token in any form.
	if strings.Contains(ck.Value, operatorSecret) || strings.Contains(ck.Value, base64.RawURLEncoding.EncodeToString([]byte(operatorSecret))) {
		t.Fatalf("the session cookie carries the token: %q", ck.Value)
	}

	r = c.do("GET", intentPath, nil)
	c.expect(r, http.StatusOK, "550 mailbox unavailable", `id="retry"`, `id="cancel"`, "op1")
	if strings.Contains(r.body, `id="resolve"`) {
		t.Fatal("resolve offered for a failed intent")
	}
	for _, h := range []string{"Content-Security-Policy", "X-Frame-Options", "Cross-Origin-Resource-Policy", "Cross-Origin-Opener-Policy"} {
		if r.hdr.Get(h) == "" {
			t.Fatalf("no %s header", h)
		}
	}
	csrf := csrfOf(t, r.body)

	// No CSRF token, a wrong one, or a cross-site request: 403, nothing done.
	c.expect(c.do("POST", intentPath+"/retry", url.Values{"note": {"x"}}), http.StatusForbidden, "CSRF")
	c.expect(c.do("POST", intentPath+"/retry", url.Values{"csrf": {strings.Repeat("0", 64)}}), http.StatusForbidden)
	c.header.Set("Origin", "https://evil.example")
	c.expect(c.do("POST", intentPath+"/retry", url.Values{"csrf": {csrf}}), http.StatusForbidden)
	c.header.Del("Origin")
	if got := e.status(failed); got != outbox.StatusFailed {
		t.Fatalf("forged requests changed the status to %s", got)
	}

	// The real form: 303 back to the page, which shows the new status.
	r = c.do("POST", intentPath+"/retry", url.Values{"csrf": {csrf}, "note": {"mailbox fixed <b>now</b>"}})
	if r.code != http.StatusSeeOther || r.hdr.Get("Location") != intentPath+"?done=retry" {
		t.Fatalf("retry = %d Location %q: %s", r.code, r.hdr.Get("Location"), r.body)
	}
	r = c.do("GET", intentPath+"?done=retry", nil)
	c.expect(r, http.StatusOK, `id="status">pending<`, "Retried", "mailbox fixed &lt;b&gt;now&lt;/b&gt;", "op1")
	if e.status(failed) != outbox.StatusPending || e.count(`SELECT count(*) FROM fencegate.intent_events WHERE intent_id = $1 AND actor = 'op1' AND action = 'retry'`, failed) != 1 {
		t.Fatal("the retry was not recorded with actor op1")
	}
	// Retrying a pending intent: the page with the error, 409.
	c.expect(c.do("POST", intentPath+"/retry", url.Values{"csrf": {csrf}, "note": {"again"}}), http.StatusConflict,
		"Cannot retry", "it is pending now", ">again</textarea>")
	// Resolve with a bad outcome: 400 naming it.
	c.expect(c.do("POST", intentPath+"/resolve", url.Values{"csrf": {csrf}, "outcome": {"maybe"}}), http.StatusBadRequest, "outcome")
	c.expect(c.do("POST", intentPath+"/explode", url.Values{"csrf": {csrf}}), http.StatusNotFound)
	c.expect(c.do("GET", "/intents/999999", nil), http.StatusNotFound)
	c.expect(c.do("GET", "/intents/abc", nil), http.StatusBadRequest, "positive integer")

	// The list and the resource page work with the session.
	c.expect(c.do("GET", "/intents?status=pending", nil), http.StatusOK, intentPath)
	c.expect(c.do("GET", "/resources/reports", nil), http.StatusOK, `id="epoch">1<`, "external_advance")

	// An unknown cookie ends the session: back to the login form.
	saved := c.cookies[sessionCookie]
	c.cookies[sessionCookie] = &http.Cookie{Name: sessionCookie, Value: "bm90LWEtdG9rZW4tMDAwMDAwMDA"}
	if r := c.do("GET", "/intents", nil); r.code != http.StatusSeeOther || !strings.HasPrefix(r.hdr.Get("Location"), "/login") {
		t.Fatalf("bad cookie: %d %s", r.code, r.hdr.Get("Location"))
	}
	c.cookies[sessionCookie] = saved

	// An open redirect through next is refused.
	for _, next := range []string{"//evil.example/x", "https://evil.example/", "/\\evil.example"} {
		r := c.do("POST", "/login", url.Values{"token": {operatorSecret}, "next": {next}})
		if r.code != http.StatusSeeOther || r.hdr.Get("Location") != "/intents" {
			t.Fatalf("next %q: %d Location %q", next, r.code, r.hdr.Get("Location"))
		}
	}

	// Scripts may use a bearer header instead (no CSRF token needed), but a
	// worker's is refused.
	b := newPageClient(t, e.ts.URL)
	b.header.Set("Authorization", "Bearer "+operatorSecret)
	b.expect(b.do("GET", "/intents", nil), http.StatusOK, intentPath)
	b.expect(b.do("POST", intentPath+"/cancel", url.Values{"note": {"scripted"}}), http.StatusSeeOther)
	b.header.Set("Authorization", "Bearer "+workerSecret)
	b.expect(b.do("GET", "/intents", nil), http.StatusForbidden, "operator token")

	// Logout needs a same-origin request carrying the form's CSRF token,
	// then clears the cookie: without the token (or with another's) it is
	// refused and the session lives on.
	// The sign-ins above made a new session: its pages carry its token.
	r = c.do("GET", "/intents", nil)
	c.expect(r, http.StatusOK)
	csrf = csrfOf(t, r.body)
	other := map[bool]string{true: "1", false: "0"}[csrf[0] == '0'] + csrf[1:]
	for _, form := range []url.Values{nil, {"csrf": {other}}} {
		if r := c.do("POST", "/logout", form); r.code != http.StatusForbidden {
			t.Fatalf("logout with form %v = %d, want 403", form, r.code)
		}
		c.expect(c.do("GET", "/intents", nil), http.StatusOK, intentPath)
	}
	sessionCopy := *c.cookies[sessionCookie]
	r = c.do("POST", "/logout", url.Values{"csrf": {csrf}})
	if r.code != http.StatusSeeOther || c.cookies[sessionCookie] != nil {
		t.Fatalf("logout = %d, cookies %v", r.code, c.cookies)
	}
	if r := c.do("GET", "/intents", nil); r.code != http.StatusSeeOther {
		t.Fatalf("after logout: %d", r.code)
	}
	// Logout ends the session on the server: a copy of the cookie taken
	// before it no longer signs anyone in.
	c.cookies[sessionCookie] = &sessionCopy
	if r := c.do("GET", "/intents", nil); r.code != http.StatusSeeOther || !strings.HasPrefix(r.hdr.Get("Location"), "/login") {
		t.Fatalf("the session cookie still works after logout: %d %s", r.code, r.hdr.Get("Location"))
	}
}

func (e *env) status(id int64) outbox.Status {
	e.t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(), testdb.SQL(`SELECT status FROM fencegate.intents WHERE intent_id = $1`), id).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	return outbox.Status(s)
}

// setupNoTokens serves a server without tokens on loopback.
func setupNoTokens(t *testing.T) *env {
	t.Helper()
	return setupWith(t, nil)
}

// Without tokens: no login, the anonymous CSRF cookie guards the forms,
// pages answer loopback Host names only, everything is escaped, keyset
// pages link onwards, and bad filters are 400 naming the field.
func TestPagesNoTokens(t *testing.T) {
	e := setupNoTokens(t)
	evil := `<script>alert("x")</script>`
	e.atEpochOne("reports", evil)
	for i := range 5 {
		e.seedIntent("", "reports", fmt.Sprintf("op-%d", i), outbox.StatusPending, "")
	}
	xss := e.seedIntent("", evil, "xss", outbox.StatusUnknown, `<img src=x onerror=alert(1)>`)
	c := newPageClient(t, e.ts.URL)

	r := c.do("GET", "/", nil)
	c.expect(r, http.StatusOK, "anonymous", "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;")
	if strings.Contains(r.body, evil) || strings.Contains(r.body, "<img src=x") {
		t.Fatal("unescaped resource or error on the list")
	}
	if c.cookies[csrfCookie] == nil {
		t.Fatal("no anonymous CSRF cookie")
	}
	c.expect(c.do("GET", "/login", nil), http.StatusSeeOther)

	// Keyset pages of 2: 6 intents → 3 pages, no duplicates.
	seen := map[string]bool{}
	path := "/intents?limit=2"
	for pages := 0; path != ""; pages++ {
		if pages > 3 {
			t.Fatal("too many pages")
		}
		r := c.do("GET", path, nil)
		c.expect(r, http.StatusOK)
		for _, m := range regexp.MustCompile(`data-intent="(\d+)"`).FindAllStringSubmatch(r.body, -1) {
			if seen[m[1]] {
				t.Fatalf("intent %s on two pages", m[1])
			}
			seen[m[1]] = true
		}
		path = ""
		if m := regexp.MustCompile(`href="([^"]+)" id="next-page"`).FindStringSubmatch(r.body); m != nil {
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if len(seen) != 6 {
		t.Fatalf("pages showed %d intents, want 6", len(seen))
	}
	c.expect(c.do("GET", "/intents?status=bogus", nil), http.StatusBadRequest, "status: must be one of")
	c.expect(c.do("GET", "/intents?status=unknown&kind=email", nil), http.StatusOK, fmt.Sprintf(`data-intent="%d"`, xss))

	// The unknown intent offers resolve, and retry only accepting a second
	// effect (its effect is possible); not cancel, saying why. Resolving it
	// records anonymous.
	ip := fmt.Sprintf("/intents/%d", xss)
	r = c.do("GET", ip, nil)
	c.expect(r, http.StatusOK, `id="resolve"`, `id="retry"`, `id="retry-force"`, `id="no-cancel"`, "&lt;img src=x")
	if strings.Contains(r.body, `id="cancel"`) {
		t.Fatal("cancel offered for an intent whose effect may have happened")
	}
	csrf := csrfOf(t, r.body)
	if csrf != c.cookies[csrfCookie].Value {
		t.Fatal("the form's CSRF token is not the cookie's")
	}
	// Without the cookie (a cross-site POST under SameSite=Strict): 403.
	saved := c.cookies[csrfCookie]
	delete(c.cookies, csrfCookie)
	c.expect(c.do("POST", ip+"/resolve", url.Values{"csrf": {csrf}, "outcome": {"succeeded"}}), http.StatusForbidden)
	c.cookies[csrfCookie] = saved
	r = c.do("POST", ip+"/resolve", url.Values{"csrf": {csrf}, "outcome": {"succeeded"}, "note": {"found in Sent"}})
	if r.code != http.StatusSeeOther {
		t.Fatalf("resolve = %d: %s", r.code, r.body)
	}
	c.expect(c.do("GET", ip, nil), http.StatusOK, `id="status">succeeded<`, "found in Sent", "anonymous")
	if e.count(`SELECT count(*) FROM fencegate.intent_events WHERE intent_id = $1 AND actor = 'anonymous'`, xss) != 1 {
		t.Fatal("no event by anonymous")
	}

	// The resource page, by a name that needs escaping in the path.
	r = c.do("GET", "/resources?resource="+url.QueryEscape(evil), nil)
	if r.code != http.StatusSeeOther {
		t.Fatalf("jump = %d", r.code)
	}
	loc := r.hdr.Get("Location")
	c.expect(c.do("GET", loc, nil), http.StatusOK, "&lt;script&gt;", `id="epoch">1<`)
	c.expect(c.do("GET", "/resources/nope", nil), http.StatusNotFound)

	// DNS rebinding: a foreign Host gets nothing.
	req, _ := http.NewRequest("GET", e.ts.URL+"/intents", nil)
	req.Host = "rebind.evil.example"
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusMisdirectedRequest || strings.Contains(string(body), "reports") {
		t.Fatalf("foreign Host: %d %s", res.StatusCode, body)
	}

	// Auto-refresh toggles a meta refresh.
	c.expect(c.do("GET", "/intents?refresh=10", nil), http.StatusOK, `<meta http-equiv="refresh" content="10">`)
}

// GET /api/v1/resources/{id}/epochs: the grants, newest first.
func TestAPIEpochs(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := e.issuer.Advance(ctx, "billing", 7); err != nil {
		t.Fatal(err)
	}
	if _, err := e.issuer.Acquire(ctx, "billing", "worker-a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	r := e.do("GET", "/api/v1/resources/billing/epochs", operatorSecret, "")
	expect(t, r, http.StatusOK, "")
	grants, _ := r.obj["grants"].([]any)
	if r.obj["resource"] != "billing" || len(grants) != 2 {
		t.Fatalf("epochs = %s", r.raw)
	}
	g0, _ := grants[0].(map[string]any)
	g1, _ := grants[1].(map[string]any)
	if num(g0["epoch"]) != 8 || g0["holder"] != "worker-a" || g0["how"] != "free" || num(g1["epoch"]) != 7 || g1["how"] != "external_advance" {
		t.Fatalf("grants = %s", r.raw)
	}
	r = e.do("GET", "/api/v1/resources/billing/epochs?limit=1", operatorSecret, "")
	if g, _ := r.obj["grants"].([]any); len(g) != 1 {
		t.Fatalf("limit=1: %s", r.raw)
	}
	expectField(t, e.do("GET", "/api/v1/resources/billing/epochs?limit=0", operatorSecret, ""), "limit")
	expectField(t, e.do("GET", "/api/v1/resources/billing/epochs?since=1", operatorSecret, ""), "since")
	expect(t, e.do("GET", "/api/v1/resources/nothing-here/epochs", operatorSecret, ""), http.StatusNotFound, "not_found")
	expect(t, e.do("GET", "/api/v1/resources/billing/epochs", workerSecret, ""), http.StatusForbidden, "forbidden")
	expect(t, e.do("GET", "/api/v1/resources/billing/epochs", "", ""), http.StatusUnauthorized, "unauthorized")
}

// A resource named "." or ".." has a page: a path cannot carry such a
// segment (browsers and Go's mux take it for a way up, even
// percent-encoded), so its links and the header's jump go to
// /resources?resource=.., which renders the page instead of redirecting.
func TestPagesDotSegmentResources(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	c := newPageClient(t, e.ts.URL)
	c.header.Set("Authorization", "Bearer "+operatorSecret)
	shown := 0
	for _, res := range []string{".", ".."} {
		e.atEpochOne(res)
		if _, err := e.ob.Enqueue(ctx, outbox.Intent{Resource: res, Epoch: 1, OperationID: "op", Kind: "file",
			Payload: json.RawMessage(`{"target":"x.txt","content":"x"}`)}); err != nil {
			t.Fatal(err)
		}
		link := "/resources?resource=" + url.QueryEscape(res)
		r := c.do("GET", "/intents?resource="+url.QueryEscape(res), nil)
		c.expect(r, http.StatusOK, `href="`+html.EscapeString(link)+`"`)
		r = c.do("GET", link, nil)
		c.expect(r, http.StatusOK, `Resource <span class="mono">`+html.EscapeString(res)+`</span>`, "Epoch history")
		shown++
	}
	t.Logf("%d dot-segment resources shown on their pages", shown)
	if shown != 2 {
		t.Fatalf("%d of 2 pages shown", shown)
	}
}
