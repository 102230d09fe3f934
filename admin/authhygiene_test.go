package admin

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// clientFrom is an HTTP client whose connections come from the loopback
// address src (127.0.0.0/8 is all loopback on Linux), so that one test
// can be two clients' addresses; it does not follow redirects.
func clientFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{
		Transport:     &http.Transport{DialContext: d.DialContext},
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

type hygieneResp struct {
	code int
	hdr  http.Header
	body string
}

func send(t *testing.T, c *http.Client, method, u, bearer string, form url.Values) hygieneResp {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return hygieneResp{code: res.StatusCode, hdr: res.Header, body: string(b)}
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// After DefaultAuthFailureLimit failed authentications from one address
// within DefaultAuthFailureWindow — unknown bearer tokens on the API and
// on the pages, refused sign-ins — every further attempt from it is 429
// with Retry-After, without any token being compared, until the window
// passes; another address is not affected. Each failure is logged with the
// address and the path, never the token presented.
func TestAuthFailureLimit(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	logs := &toolbin.SyncBuffer{}
	s := newServer(t, pool, testTokens, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	clock := &fakeClock{t: time.Now()}
	s.limiter.now = clock.now
	var compared int
	var cmu sync.Mutex
	s.auth.compare = func(a, b []byte) int {
		cmu.Lock()
		compared++
		cmu.Unlock()
		return subtleCompare(a, b)
	}
	comparisons := func() int {
		cmu.Lock()
		defer cmu.Unlock()
		return compared
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	a, b := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")

	const guess = "guessed-token-0123456789abc"
	// The failures, mixed: API bearer, page bearer, the login form (an
	// unknown token and a worker's: both are refused sign-ins).
	for i := range DefaultAuthFailureLimit {
		var r hygieneResp
		switch i % 4 {
		case 0:
			r = send(t, a, "GET", ts.URL+"/api/v1/intents", guess, nil)
		case 1:
			r = send(t, a, "GET", ts.URL+"/metrics", guess, nil)
		case 2:
			r = send(t, a, "POST", ts.URL+"/login", "", url.Values{"token": {guess}})
		case 3:
			r = send(t, a, "POST", ts.URL+"/login", "", url.Values{"token": {workerSecret}})
		}
		if r.code != http.StatusUnauthorized {
			t.Fatalf("failure %d: status %d, want 401: %s", i+1, r.code, r.body)
		}
	}
	before := comparisons()
	for _, tc := range []struct {
		method, path, bearer string
		form                 url.Values
	}{
		{"GET", "/api/v1/intents", operatorSecret, nil},
		{"POST", "/api/v1/leases", workerSecret, nil},
		{"GET", "/metrics", operatorSecret, nil},
		{"GET", "/intents", operatorSecret, nil},
		{"POST", "/login", "", url.Values{"token": {operatorSecret}}},
	} {
		r := send(t, a, tc.method, ts.URL+tc.path, tc.bearer, tc.form)
		ra, _ := strconv.Atoi(r.hdr.Get("Retry-After"))
		if r.code != http.StatusTooManyRequests || ra < 1 || ra > int(DefaultAuthFailureWindow/time.Second) {
			t.Fatalf("%s %s after %d failures: %d Retry-After %q, want 429 with Retry-After 1..%d: %s",
				tc.method, tc.path, DefaultAuthFailureLimit, r.code, r.hdr.Get("Retry-After"), int(DefaultAuthFailureWindow/time.Second), r.body)
		}
		if strings.HasPrefix(tc.path, "/api/") && !strings.Contains(r.body, `"code":"too_many_failures"`) {
			t.Fatalf("%s: body %s, want code too_many_failures", tc.path, r.body)
		}
	}
	if n := comparisons() - before; n != 0 {
		t.Fatalf("a limited address had %d token comparisons made, want 0", n)
	}
	// Another address is not limited.
	if r := send(t, b, "GET", ts.URL+"/api/v1/intents", operatorSecret, nil); r.code != http.StatusOK {
		t.Fatalf("another address: %d %s", r.code, r.body)
	}
	// Health and readiness are not behind the limit.
	if r := send(t, a, "GET", ts.URL+"/healthz", "", nil); r.code != http.StatusOK {
		t.Fatalf("/healthz from the limited address: %d", r.code)
	}
	clock.advance(DefaultAuthFailureWindow + time.Second)
	if r := send(t, a, "GET", ts.URL+"/api/v1/intents", operatorSecret, nil); r.code != http.StatusOK {
		t.Fatalf("after the window: %d %s", r.code, r.body)
	}

	out := logs.String()
	fails := strings.Count(out, "authentication failed")
	if fails != DefaultAuthFailureLimit {
		t.Fatalf("%d failures logged, want %d:\n%s", fails, DefaultAuthFailureLimit, out)
	}
	for _, want := range []string{"remote=127.0.0.1", "path=/api/v1/intents", "path=/metrics", "path=/login"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	for _, secret := range []string{guess, workerSecret, operatorSecret} {
		if strings.Contains(out, secret) {
			t.Fatalf("the log shows a presented token %q:\n%s", secret, out)
		}
	}
	t.Logf("%d failures logged; %d requests refused with 429", fails, 5)
}

// The login form gives one answer for an unknown token and a valid token
// of the wrong role: the same status and the same words, so it cannot be
// used to test whether a token is valid.
func TestLoginOneAnswer(t *testing.T) {
	e := setup(t)
	c := newPageClient(t, e.ts.URL)
	unknown := c.do("POST", "/login", url.Values{"token": {"not-a-token-at-all-0123"}, "next": {"/intents"}})
	worker := c.do("POST", "/login", url.Values{"token": {workerSecret}, "next": {"/intents"}})
	if unknown.code != worker.code || unknown.code != http.StatusUnauthorized {
		t.Fatalf("unknown token: %d, worker token: %d; want both 401", unknown.code, worker.code)
	}
	if unknown.body != worker.body {
		t.Fatalf("the answers differ:\nunknown: %s\nworker: %s", unknown.body, worker.body)
	}
	if strings.Contains(worker.body, "w1") || strings.Contains(worker.body, "worker") {
		t.Fatalf("the answer names the token or its role:\n%s", worker.body)
	}
	if len(c.cookies) != 0 {
		t.Fatalf("a refused login set cookies: %v", c.cookies)
	}
}

// Weak secrets are refused when tokens are loaded: too short, too few
// distinct bytes, one unit repeated, or a run with one step. The error
// names the token, never its secret. Random secrets of 128 bits and the
// documented examples pass.
func TestWeakTokensRefused(t *testing.T) {
	t.Parallel()
	for _, weak := range []string{
		strings.Repeat("a", 16),
		strings.Repeat("A", 40),
		"abababababababab",
		"abcdabcdabcdabcdabcd",
		"password12password12",
		"abcdefghijklmnopqrst",
		"0123456789:;<=>?@ABC",
		"zyxwvutsrqponmlkjih",
		"aaaaaaaabbbbbbbbcccccccc",
		"short-1234",
	} {
		_, err := ParseTokens("weakling:worker:" + weak)
		if err == nil {
			t.Errorf("secret %q accepted", weak)
			continue
		}
		if !strings.Contains(err.Error(), `"weakling"`) || strings.Contains(err.Error(), weak) {
			t.Errorf("secret %q: error %q must name the token and not show the secret", weak, err)
		}
		_, err = New(Config{Tokens: []Token{{Name: "weakling", Role: RoleWorker, Secret: weak}}})
		if err == nil || strings.Contains(err.Error(), weak) {
			t.Errorf("New with secret %q: %v", weak, err)
		}
	}
	strong := []string{"3f9c1d0e8b7a4c2d9e6f5a4b3c2d1e0f", "a1b2c3d4e5f60718293a4b5c6d7e8f90", workerSecret, operatorSecret}
	for range 200 {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		strong = append(strong, base64.RawURLEncoding.EncodeToString(b))
		hexed := make([]byte, 16)
		_, _ = rand.Read(hexed)
		strong = append(strong, strings.ToLower(strings.TrimRight(base64.StdEncoding.EncodeToString(hexed), "=")))
	}
	for i, sec := range strong {
		if _, err := ParseTokens("t" + strconv.Itoa(i) + ":operator:" + sec); err != nil {
			t.Errorf("secret %q refused: %v", sec, err)
		}
	}
	t.Logf("%d strong secrets accepted", len(strong))
}

// The session cookie is __Host-fencegate_session: Secure (also over plain
// HTTP, on loopback or behind a TLS-terminating proxy, where the browser
// sees https), Path=/, no Domain, HttpOnly, SameSite=Strict; logout clears
// it with the same attributes.
func TestSessionCookieHostPrefix(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	for _, insecure := range []bool{false, true} {
		s := newServer(t, pool, testTokens, func(c *Config) { c.InsecureHTTP = insecure })
		ts := httptest.NewServer(s.Handler())
		t.Cleanup(ts.Close)
		c := clientFrom("127.0.0.1")
		r := send(t, c, "POST", ts.URL+"/login", "", url.Values{"token": {operatorSecret}, "next": {"/intents"}})
		res := &http.Response{Header: r.hdr}
		var got *http.Cookie
		for _, ck := range res.Cookies() {
			got = ck
		}
		if r.code != http.StatusSeeOther || got == nil || got.Name != "__Host-fencegate_session" || !got.Secure || got.Path != "/" ||
			got.Domain != "" || !got.HttpOnly || got.SameSite != http.SameSiteStrictMode {
			t.Fatalf("insecure-http=%v: login %d, cookie %+v; want a Secure __Host-fencegate_session, Path=/, no Domain", insecure, r.code, got)
		}
		req, _ := http.NewRequest("POST", ts.URL+"/logout", strings.NewReader(url.Values{"csrf": {sessionCSRF(got.Value)}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(&http.Cookie{Name: got.Name, Value: got.Value})
		out, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out.Body.Close()
		cl := out.Cookies()
		if len(cl) != 1 || cl[0].Name != "__Host-fencegate_session" || cl[0].MaxAge >= 0 || !cl[0].Secure || cl[0].Path != "/" {
			t.Fatalf("insecure-http=%v: logout cookies %+v; want the session cookie cleared, Secure, Path=/", insecure, cl)
		}
	}
}

// A token holds at most MaxSessionsPerToken sessions: one more sign-in
// ends its oldest session; the others and other tokens' sessions live on.
func TestSessionCapPerToken(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	other := Token{Name: "op2", Role: RoleOperator, Secret: "other-operator-secret-987654"}
	s := newServer(t, pool, append(append([]Token{}, testTokens...), other), nil)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	c := clientFrom("127.0.0.1")
	login := func(secret string) string {
		r := send(t, c, "POST", ts.URL+"/login", "", url.Values{"token": {secret}})
		for _, ck := range (&http.Response{Header: r.hdr}).Cookies() {
			if ck.Value != "" {
				return ck.Value
			}
		}
		t.Fatalf("login: %d, no session cookie", r.code)
		return ""
	}
	works := func(id string) bool {
		req, _ := http.NewRequest("GET", ts.URL+"/intents", nil)
		req.AddCookie(&http.Cookie{Name: sessionCookie, Value: id})
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}
	theirs := login(other.Secret)
	var ids []string
	for range MaxSessionsPerToken + 1 {
		ids = append(ids, login(operatorSecret))
	}
	if works(ids[0]) {
		t.Fatalf("the oldest of %d sessions of one token still works", len(ids))
	}
	live := 0
	for _, id := range ids[1:] {
		if works(id) {
			live++
		}
	}
	if live != MaxSessionsPerToken || !works(theirs) {
		t.Fatalf("%d of the newest %d sessions work (want all), another token's works: %v", live, MaxSessionsPerToken, works(theirs))
	}
	t.Logf("%d sessions live after %d sign-ins", live, len(ids))
}

// Without tokens, every path answers only a loopback Host (against DNS
// rebinding), /metrics and /readyz too; /healthz, which says nothing but
// "ok", answers any Host so that a probe can reach it by any name.
func TestHostCheckEveryPath(t *testing.T) {
	e := setupNoTokens(t)
	get := func(path, host string) int {
		req, _ := http.NewRequestWithContext(context.Background(), "GET", e.ts.URL+path, nil)
		req.Host = host
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	n := 0
	for _, path := range []string{"/metrics", "/readyz", "/api/v1/intents", "/intents", "/no-such-path"} {
		if code := get(path, "rebind.attacker.example"); code != http.StatusMisdirectedRequest {
			t.Errorf("%s with a foreign Host: %d, want 421", path, code)
		}
		if code := get(path, "localhost"); code == http.StatusMisdirectedRequest {
			t.Errorf("%s with Host localhost: 421", path)
		}
		n++
	}
	if code := get("/healthz", "rebind.attacker.example"); code != http.StatusOK {
		t.Errorf("/healthz with a foreign Host: %d, want 200", code)
	}
	t.Logf("%d paths checked", n)
}
