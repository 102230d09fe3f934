package admin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Pages authenticate operators by a cookie, since browsers cannot easily
// send bearer headers:
//
//   - With tokens configured, POST /login takes an operator token and
//     starts a server-side session: the cookie holds only the session's
//     random id (never the token), HttpOnly, SameSite=Strict, and always
//     Secure with the __Host- prefix (Path=/, no Domain), so that a
//     browser never sends it over a clear connection nor lets a sibling
//     domain set it. Plain HTTP is served only on loopback, which
//     Chromium and Firefox treat as secure for cookies, or behind a
//     TLS-terminating proxy (InsecureHTTP), where the browser sees https.
//     The session expires after sessionMaxAge, and logout deletes it, so
//     a copied cookie stops working; a token holds at most
//     MaxSessionsPerToken sessions (one more ends its oldest). Sessions
//     live in this process (behind several replicas, use sticky sessions
//     or bearer headers). An Authorization: Bearer header works too, for
//     scripts.
//   - With no tokens (the server binds loopback only) every viewer is
//     anonymous and no login exists; pages then answer only requests whose
//     Host is a loopback name, so a DNS-rebinding page cannot read them.
//
// Every POST form is checked twice against cross-site request forgery:
// net/http's CrossOriginProtection (Sec-Fetch-Site / Origin against Host)
// and a CSRF token in a hidden field. With a session the token is an HMAC
// of a fixed string keyed by the session's secret (stateless, the same on
// process, useless without the cookie); without tokens it must equal
// a random SameSite=Strict cookie (double submit). Bearer requests need no
// CSRF token: a browser never adds that header on its own.
const (
	sessionCookie = "__Host-fencegate_session"
	csrfCookie    = "fencegate_csrf"
	csrfField     = "csrf"
	sessionMaxAge = 8 * time.Hour
	// MaxSessionsPerToken is how many sessions one token holds at most:
	// a sign-in past it ends the token's oldest session, so sign-ins in a
	// loop cannot fill the server's memory.
	MaxSessionsPerToken = 16
)

// viewer is who looks at the pages.
type viewer struct {
	principal
	// csrf is the token this viewer's forms carry.
	csrf string
	// session: authenticated by the session cookie (logout is offered).
	session bool
	// bearerAuth: authenticated by an Authorization header: no CSRF token
	// is needed.
	bearerAuth bool
}

// pageAuthErr is why a page request was refused.
type pageAuthErr int

const (
	authOK pageAuthErr = iota
	authLogin
	authForbidden
	authBadHost
	// authLimited: the address made too many failed authentications
	// (limit.go).
	authLimited
)

// sessionCSRF derives the CSRF token of a session from its secret.
func sessionCSRF(secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("fencegate pages csrf v1"))
	return hex.EncodeToString(m.Sum(nil))
}

// pageViewer authenticates a page request. It may set the anonymous CSRF
// cookie on w.
func (s *Server) pageViewer(w http.ResponseWriter, r *http.Request) (*viewer, pageAuthErr) {
	if len(s.cfg.Tokens) == 0 {
		if !loopbackHost(r.Host) {
			return nil, authBadHost
		}
		v := &viewer{principal: principal{name: anonymous, role: RoleOperator}}
		if c, err := r.Cookie(csrfCookie); err == nil && validCSRFCookie(c.Value) {
			v.csrf = c.Value
		} else {
			v.csrf = randomToken()
			http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v.csrf, Path: "/",
				HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			// The handler may check the form against the new cookie in the
			// same request (a POST without the cookie): it will not match.
		}
		return v, authOK
	}
	if tok, ok := bearer(r); ok {
		if s.limitWait(r) > 0 {
			return nil, authLimited
		}
		p, ok := s.auth.lookup(tok)
		if !ok {
			s.authFailed(r, "unknown token")
			return nil, authLogin
		}
		if p.role != RoleOperator {
			return &viewer{principal: p}, authForbidden
		}
		return &viewer{principal: p, csrf: sessionCSRF(tok), bearerAuth: true}, authOK
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, authLogin
	}
	p, ok := s.sessions.get(c.Value)
	if !ok {
		// Expired, logged out, or never ours: the session ends.
		clearSession(w)
		return nil, authLogin
	}
	if p.role != RoleOperator {
		return &viewer{principal: p, session: true}, authForbidden
	}
	return &viewer{principal: p, csrf: sessionCSRF(c.Value), session: true}, authOK
}

// sessionStore holds the pages' sessions: id → who, until when.
type sessionStore struct {
	mu   sync.Mutex
	byID map[string]session
	now  func() time.Time
}

type session struct {
	p       principal
	expires time.Time
}

func newSessionStore() *sessionStore {
	return &sessionStore{byID: map[string]session{}, now: time.Now}
}

// start makes a session for p and returns its id.
func (st *sessionStore) start(p principal) string {
	id := randomToken()
	st.mu.Lock()
	defer st.mu.Unlock()
	now := st.now()
	for k, v := range st.byID { // forget the expired ones
		if now.After(v.expires) {
			delete(st.byID, k)
		}
	}
	// The token's oldest sessions end while it holds the most it may.
	for {
		oldest, n := "", 0
		for k, v := range st.byID {
			if v.p.name != p.name {
				continue
			}
			n++
			if oldest == "" || v.expires.Before(st.byID[oldest].expires) {
				oldest = k
			}
		}
		if n < MaxSessionsPerToken {
			break
		}
		delete(st.byID, oldest)
	}
	st.byID[id] = session{p: p, expires: now.Add(sessionMaxAge)}
	return id
}

func (st *sessionStore) get(id string) (principal, bool) {
	if !validCSRFCookie(id) { // the same shape: 64 hex digits
		return principal{}, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.byID[id]
	if !ok || st.now().After(v.expires) {
		delete(st.byID, id)
		return principal{}, false
	}
	return v.p, true
}

func (st *sessionStore) end(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.byID, id)
}

// checkForm checks a POST form against cross-site request forgery; the
// caller has parsed the form.
func (s *Server) checkForm(r *http.Request, v *viewer) bool {
	if s.cop.Check(r) != nil {
		return false
	}
	if v != nil && v.bearerAuth {
		return true
	}
	got := r.PostFormValue(csrfField)
	return v != nil && got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(v.csrf)) == 1
}

// setSession sets the session cookie. A __Host- cookie must be Secure,
// with Path=/ and no Domain, or the browser drops it; clearing it needs
// the same attributes.
func setSession(w http.ResponseWriter, id string) {
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: id, Path: "/",
		MaxAge: int(sessionMaxAge / time.Second), HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: true,
	})
}

func clearSession(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: true})
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}

func validCSRFCookie(v string) bool {
	if len(v) != 64 {
		return false
	}
	_, err := hex.DecodeString(v)
	return err == nil
}

// loopbackHost reports whether a Host header names this machine by a
// loopback name or address.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// safeNext returns next when it is a path on this server, else the intents
// list: the login form must not redirect anywhere else.
func safeNext(next string) string {
	if next == "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/intents"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return "/intents"
	}
	return next
}

// loginPage: GET /login.
func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if len(s.cfg.Tokens) == 0 {
		http.Redirect(w, r, "/intents", http.StatusSeeOther)
		return
	}
	s.render(w, r, http.StatusOK, "login", &pageData{Title: "Sign in", Body: loginBody{Next: safeNext(r.URL.Query().Get("next"))}})
}

type loginBody struct {
	Next string
}

// login: POST /login with token and next. The token is looked up like a
// bearer token; an operator token becomes the session cookie.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if len(s.cfg.Tokens) == 0 {
		http.Redirect(w, r, "/intents", http.StatusSeeOther)
		return
	}
	setPageHeaders(w, s.styleHash)
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		s.render(w, r, http.StatusBadRequest, "login", &pageData{Title: "Sign in", Error: "The form could not be read.", Body: loginBody{Next: "/intents"}})
		return
	}
	next := safeNext(r.PostFormValue("next"))
	// Login CSRF: a cross-site form must not sign the browser in.
	if s.cop.Check(r) != nil {
		s.render(w, r, http.StatusForbidden, "login", &pageData{Title: "Sign in", Error: "Cross-site request refused.", Body: loginBody{Next: next}})
		return
	}
	if d := s.limitWait(r); d > 0 {
		w.Header().Set("Retry-After", retryAfter(d))
		s.render(w, r, http.StatusTooManyRequests, "login", &pageData{Title: "Sign in",
			Error: "Too many failed sign-ins from this address: try again in " + retryAfter(d) + " seconds.", Body: loginBody{Next: next}})
		return
	}
	tok := strings.TrimSpace(r.PostFormValue("token"))
	p, ok := s.auth.lookup(tok)
	if !ok || p.role != RoleOperator {
		// One answer whether the token is unknown or a valid token of
		// another role, so the form cannot tell a guesser that a token
		// is valid; both count as failures alike. The log says which.
		why := "unknown token"
		if ok {
			why = "not an operator token: " + p.name
		}
		s.authFailed(r, why)
		s.render(w, r, http.StatusUnauthorized, "login", &pageData{Title: "Sign in",
			Error: "Not signed in: the pages need a valid operator token.", Body: loginBody{Next: next}})
		return
	}
	setSession(w, s.sessions.start(p))
	s.cfg.Logger.Info("admin: page login", "actor", p.name, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout: POST /logout clears the session cookie.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if s.cop.Check(r) != nil {
		setPageHeaders(w, s.styleHash)
		s.renderError(w, r, nil, http.StatusForbidden, "Cross-site request refused.")
		return
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		// A live session ends only by its own form: the CSRF token the
		// layout's logout form carries. CrossOriginProtection and
		// SameSite=Strict already stop a forged logout in browsers; this
		// holds without them. A cookie of no live session is cleared as is.
		if _, live := s.sessions.get(c.Value); live {
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue(csrfField)), []byte(sessionCSRF(c.Value))) != 1 {
				setPageHeaders(w, s.styleHash)
				s.renderError(w, r, nil, http.StatusForbidden, "Cross-site request refused.")
				return
			}
		}
		s.sessions.end(c.Value) // a copy of the cookie stops working too
	}
	clearSession(w)
	target := "/login"
	if len(s.cfg.Tokens) == 0 {
		target = "/intents"
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// Name is the viewer's token name (the actor of its actions).
func (v *viewer) Name() string { return v.name }

// CSRF is the token the viewer's forms carry.
func (v *viewer) CSRF() string { return v.csrf }

// Session reports whether the viewer signed in with the session cookie.
func (v *viewer) Session() bool { return v.session }

// Scoped reports whether the viewer's token is confined to resources.
func (v *viewer) Scoped() bool { return !v.scope.allResources() }
