package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// The HTML pages for operators: server-rendered with html/template (which
// escapes every value for its context), no JavaScript, no build step. A
// list page can refresh itself (a meta refresh the viewer toggles).
//
//	GET  / and /intents           the intents list: status tabs with counts,
//	                              filters (search, kind, resource, time
//	                              range), keyset pages, rows to pick for a
//	                              bulk action
//	GET  /intents/{id}            an intent: details, timeline, actions
//	POST /intents/{id}/{action}   retry, cancel, resolve (303 back, or the
//	                              page with the error: 409 invalid state)
//	POST /intents/bulk            a bulk action on a filter: step=preview
//	                              (a dry run: how many and which it would
//	                              touch),
//	                              then step=apply (303 to the list)
//	GET  /resources/{id}          a resource: epoch, lease, counts, grants
//	GET  /resources               the resources: epoch, lease, counts
//	GET  /resources?resource=     jump to a resource
//	GET  /login, POST /login      the session cookie (tokens configured)
//	POST /logout
//
// Authentication and CSRF: see pages_auth.go.

//go:embed templates
var templateFS embed.FS

// pageNames are the templates besides the layout.
var pageNames = []string{"intents", "intent", "bulk", "resource", "resources", "login", "error"}

// pageTemplates parses each page with the layout; the style sheet is
// inlined and its hash allowed by the Content-Security-Policy.
func pageTemplates() (map[string]*template.Template, template.CSS, string, error) {
	css, err := fs.ReadFile(templateFS, "templates/style.css")
	if err != nil {
		return nil, "", "", err
	}
	sum := sha256.Sum256(css)
	hash := "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(pageFuncs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, "", "", fmt.Errorf("admin: page templates: %w", err)
		}
		out[name] = t
	}
	return out, template.CSS(css), hash, nil
}

var pageFuncs = template.FuncMap{
	"when":        fmtTime,
	"iso":         isoTime,
	"rel":         func(v any) string { return relTime(v, time.Now()) },
	"resourceURL": resourceURL,
	"intentURL":   func(id int64) string { return "/intents/" + strconv.FormatInt(id, 10) },
	"deref": func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	},
	"since": func(d *time.Duration) string {
		if d == nil {
			return ""
		}
		return d.Round(time.Millisecond).String()
	},
	"effectNote": effectNote,
	// after: t relative to from ("+1.204s"), for a timeline read from
	// the intent's commit; empty when t is nil.
	"after": func(from time.Time, t *time.Time) string {
		if t == nil {
			return ""
		}
		return "+" + t.Sub(from).Round(time.Millisecond).String()
	},
	"ms": func(f *float64) string {
		if f == nil {
			return ""
		}
		return time.Duration(*f * float64(time.Millisecond)).Round(time.Millisecond).String()
	},
	"short": func(s string, n int) string {
		if len(s) <= n {
			return s
		}
		cut := n
		for cut > 0 && !utf8Start(s[cut]) {
			cut--
		}
		return s[:cut] + "…"
	},
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// effectNote explains an intent's effect in a few words.
func effectNote(e outbox.Effect) string {
	switch e {
	case outbox.EffectNone:
		return "no attempt can have reached the destination (or a lookup proved none did)"
	case outbox.EffectPossible:
		return "an attempt's outcome was lost: the effect may have happened"
	case outbox.EffectDone:
		return "the effect happened"
	}
	return ""
}

// fmtTime formats a time, *time.Time (nil: empty) in UTC to the millisecond.
func fmtTime(v any) string {
	var t time.Time
	switch x := v.(type) {
	case time.Time:
		t = x
	case *time.Time:
		if x == nil {
			return ""
		}
		t = *x
	default:
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// isoTime formats a time for a <time datetime> attribute.
func isoTime(v any) string {
	t, ok := timeOf(v)
	if !ok {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func timeOf(v any) (time.Time, bool) {
	switch x := v.(type) {
	case time.Time:
		return x, true
	case *time.Time:
		if x != nil {
			return *x, true
		}
	}
	return time.Time{}, false
}

// relTime says how long ago (or in how long) a time is from now, in the
// largest whole unit: "just now", "45s ago", "3m ago", "in 2h", "4d ago";
// beyond 30 days the date. The pages put the absolute time beside it (a
// title: shown on hover).
func relTime(v any, now time.Time) string {
	t, ok := timeOf(v)
	if !ok {
		return ""
	}
	d := now.Sub(t)
	future := d < 0
	if future {
		d = -d
	}
	var n string
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		n = strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		n = strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		n = strconv.Itoa(int(d/time.Hour)) + "h"
	case d < 30*24*time.Hour:
		n = strconv.Itoa(int(d/(24*time.Hour))) + "d"
	default:
		return t.UTC().Format("2006-01-02")
	}
	if future {
		return "in " + n
	}
	return n + " ago"
}

func resourceURL(resource string) string {
	if dotSegment(resource) {
		// Browsers and proxies take "/resources/.." for a way up, even
		// percent-encoded: such a resource's page is at the jump's URL,
		// which renders it.
		return pathWithQuery("/resources", url.Values{"resource": {resource}})
	}
	return "/resources/" + url.PathEscape(resource)
}

// dotSegment reports whether a resource name is "." or "..", which a
// path segment cannot carry.
func dotSegment(resource string) bool { return resource == "." || resource == ".." }

// pageData is what the layout draws; Body is the page's own.
type pageData struct {
	Title   string
	Error   string
	Flash   string
	Viewer  *viewer
	Auth    bool
	Style   template.CSS
	Nav     string
	Refresh int
	// RefreshOn and RefreshOff link to this page with and without
	// auto-refresh; empty: the page offers none.
	RefreshOn, RefreshOff string
	Body                  any
}

type viewerKey struct{}

// render writes a page. A template error is logged and answered 500.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, d *pageData) {
	d.Style = s.style
	d.Auth = len(s.cfg.Tokens) > 0
	if v, ok := r.Context().Value(viewerKey{}).(*viewer); ok && d.Viewer == nil {
		d.Viewer = v
	}
	var buf bytes.Buffer
	if err := s.tmpl[name].Execute(&buf, d); err != nil {
		s.cfg.Logger.Error("admin: render page", "page", name, "err", err)
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	setPageHeaders(w, s.styleHash)
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) renderError(w http.ResponseWriter, r *http.Request, v *viewer, status int, msg string) {
	s.render(w, r, status, "error", &pageData{Title: http.StatusText(status), Error: msg, Viewer: v})
}

// pageFail answers err with the status the API would give it.
func (s *Server) pageFail(w http.ResponseWriter, r *http.Request, err error) {
	ae := toAPIError(err)
	if ae.Status() >= 500 {
		s.cfg.Logger.Error("admin: page failed", "method", r.Method, "path", r.URL.Path, "status", ae.Status(), "err", err)
	}
	s.renderError(w, r, nil, ae.Status(), ae.Message)
}

func setPageHeaders(w http.ResponseWriter, styleHash string) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	// Another site's page may neither load a page as a subresource (a
	// no-cors read of /intents?q=…, which in no-token mode carries no
	// credential to stop it) nor keep a handle on a window it opened.
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src '"+styleHash+"'; img-src data:; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
}

// page wraps a page handler with authentication.
func (s *Server) page(h func(w http.ResponseWriter, r *http.Request, v *viewer)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, res := s.pageViewer(w, r)
		switch res {
		case authBadHost:
			s.renderError(w, r, nil, http.StatusMisdirectedRequest,
				"This server has no API tokens: its pages answer only at a loopback address (127.0.0.1, [::1], localhost).")
			return
		case authLogin:
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			s.renderError(w, r, nil, http.StatusUnauthorized, "Not signed in, or the session ended: sign in and try again.")
			return
		case authLimited:
			ra := retryAfter(s.limitWait(r))
			w.Header().Set("Retry-After", ra)
			s.renderError(w, r, nil, http.StatusTooManyRequests,
				"Too many failed authentications from this address: try again in "+ra+" seconds.")
			return
		case authForbidden:
			s.renderError(w, r, v, http.StatusForbidden,
				fmt.Sprintf("Token %q has role %s; the pages need an operator token.", v.name, v.role))
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), viewerKey{}, v)), v)
	})
}

func (s *Server) pageRoutes() error {
	tmpl, style, hash, err := pageTemplates()
	if err != nil {
		return err
	}
	s.tmpl, s.style, s.styleHash = tmpl, style, hash
	s.cop = http.NewCrossOriginProtection()
	s.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.renderError(w, r, nil, http.StatusForbidden, "Cross-site request refused.")
	}))

	// Pages answer a foreign Host themselves (pageViewer), as a page.
	s.pagePatterns = map[string]bool{}
	for _, pattern := range []string{"GET /{$}", "GET /intents", "GET /intents/{id}", "POST /intents/bulk",
		"POST /intents/{id}/{action}", "GET /resources", "GET /resources/{id}"} {
		s.pagePatterns[pattern] = true
	}
	s.mux.Handle("GET /{$}", s.page(s.intentsPage))
	s.mux.Handle("GET /intents", s.page(s.intentsPage))
	s.mux.Handle("GET /intents/{id}", s.page(s.intentPage))
	s.mux.Handle("POST /intents/bulk", s.page(s.bulkPost))
	s.mux.Handle("POST /intents/{id}/{action}", s.page(s.intentActionPost))
	s.mux.Handle("GET /resources", s.page(s.resourcesPage))
	s.mux.Handle("GET /resources/{id}", s.page(s.resourcePage))
	s.mux.HandleFunc("GET /login", s.loginPage)
	s.mux.HandleFunc("POST /login", s.login)
	s.mux.HandleFunc("POST /logout", s.logout)
	return nil
}

// refreshChoices are the auto-refresh periods a page accepts, in seconds.
var refreshChoices = []int{5, 10, 30, 60}

// withRefresh fills in the auto-refresh links of a page at u.
func withRefresh(d *pageData, u *url.URL) {
	q := u.Query()
	if n, err := strconv.Atoi(q.Get("refresh")); err == nil && slices.Contains(refreshChoices, n) {
		d.Refresh = n
	}
	on := cloneQuery(q)
	on.Set("refresh", "10")
	off := cloneQuery(q)
	off.Del("refresh")
	for _, k := range []string{"done", "bulk", "applied", "skipped", "skipped_effect"} {
		off.Del(k)
		on.Del(k)
	}
	d.RefreshOn = pathWithQuery(u.EscapedPath(), on)
	d.RefreshOff = pathWithQuery(u.EscapedPath(), off)
}

func cloneQuery(q url.Values) url.Values {
	out := url.Values{}
	for k, v := range q {
		out[k] = slices.Clone(v)
	}
	return out
}

func pathWithQuery(path string, q url.Values) string {
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// pageLinks returns the links of a page of the list at path under
// filters: to the next page when there is one (nextCursor), and to the
// first page when this page is not it (it was asked for with a cursor).
func pageLinks(path string, filters url.Values, nextCursor *string, cursor string) (nextURL, firstURL string) {
	if nextCursor != nil {
		next := cloneQuery(filters)
		next.Set("cursor", *nextCursor)
		nextURL = pathWithQuery(path, next)
	}
	if cursor != "" {
		firstURL = pathWithQuery(path, filters)
	}
	return nextURL, firstURL
}

// intentsBody is the list page.
type intentsBody struct {
	Status, Kind, Resource, Search, Since, Until, Limit string
	Kinds                                               []string
	// Tabs are the statuses with their counts under the other filters.
	Tabs []statusTab
	Rows []operator.Row
	// NextURL is the next (older) page; FirstURL the first page, when
	// this is not it.
	NextURL, FirstURL string
	Filtered          bool
	// Bulk is the bulk action form, offered for a status filter some
	// action applies to, to an unscoped viewer; its rows can be picked.
	Bulk *bulkForm
}

// statusTab is a tab of the list: a status (empty: all) and its count.
type statusTab struct {
	Label   string
	N       int64
	AtLeast bool
	URL     string
	On      bool
	Status  outbox.Status
}

// bulkForm is a bulk action's form: the list's filters, the actions that
// apply to its status.
type bulkForm struct {
	Actions []operator.Action
	operator.BulkRequest
	// Preview is the dry run's answer (the bulk page); Scope describes the
	// filter in words.
	Preview *operator.BulkResult
	Scope   string
	// Touch is how many intents the previewed action would change: those
	// matched less those skipped because their effect is possible; Possible
	// is those.
	Touch, Possible int
}

// bulkActions are the actions that apply to intents of status st.
func bulkActions(st outbox.Status) []operator.Action {
	var out []operator.Action
	for _, a := range []operator.Action{operator.ActionRetry, operator.ActionCancel, operator.ActionResolve} {
		if a.AppliesTo(st) {
			out = append(out, a)
		}
	}
	return out
}

// bulkFlash is the list's flash after a bulk action
// (?bulk=&applied=&skipped=&skipped_effect=).
func bulkFlash(q url.Values) string {
	a := q.Get("bulk")
	if operator.Action(a).AllowedFrom() == nil {
		return ""
	}
	applied, err1 := strconv.Atoi(q.Get("applied"))
	skipped, err2 := strconv.Atoi(q.Get("skipped"))
	if err1 != nil || err2 != nil {
		return ""
	}
	// skipped_effect is part of skipped: those refused because their effect
	// may have happened; the rest had moved on meanwhile.
	effect, _ := strconv.Atoi(q.Get("skipped_effect"))
	effect = max(0, min(effect, skipped))
	msg := fmt.Sprintf("Bulk %s: %d intents changed", a, applied)
	if moved := skipped - effect; moved > 0 {
		msg += fmt.Sprintf(", %d skipped (they had moved on meanwhile)", moved)
	}
	if effect > 0 {
		msg += fmt.Sprintf(", %d skipped because their effect may have happened (an attempt's outcome was lost): "+
			"resolve them with what you find at the destination", effect)
		if a == string(operator.ActionRetry) {
			msg += ", or retry them accepting a second effect"
		}
	}
	return msg + "."
}

// intentsPage: GET / and GET
// /intents?status=&kind=&resource=&q=&since=&until=&limit=&cursor=.
func (s *Server) intentsPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	q := r.URL.Query()
	b := intentsBody{Status: q.Get("status"), Kind: q.Get("kind"), Resource: q.Get("resource"), Limit: q.Get("limit"),
		Search: strings.TrimSpace(q.Get("q")), Since: strings.TrimSpace(q.Get("since")), Until: strings.TrimSpace(q.Get("until")),
		Kinds: s.cfg.Outbox.Kinds()}
	b.Filtered = b.Status != "" || b.Kind != "" || b.Resource != "" || b.Search != "" || b.Since != "" || b.Until != ""
	d := &pageData{Title: "Intents", Nav: "intents", Body: &b, Flash: bulkFlash(q)}
	withRefresh(d, r.URL)
	if acts := bulkActions(outbox.Status(b.Status)); len(acts) > 0 && v.scope.allResources() {
		// The list's resource is an exact name: the form keeps it as one,
		// not as a prefix (which would take in every resource whose name
		// starts with it, intents the list does not show).
		b.Bulk = &bulkForm{Actions: acts, BulkRequest: operator.BulkRequest{Status: outbox.Status(b.Status), Kind: b.Kind, Resource: b.Resource,
			Search: b.Search, Since: b.Since, Until: b.Until}}
	}
	// A token scoped to resources sees one resource of its scope at a
	// time, as GET /api/v1/intents: the list across resources would show
	// others'.
	if !v.scope.allResources() {
		err := v.resource(b.Resource)
		if b.Resource == "" {
			err = forbidden("resource", "token %q is scoped to resources %s: filter by a resource", v.name, strings.Join(v.scope.Resources, ", "))
		}
		if err != nil {
			d.Error = toAPIError(err).Message
			s.render(w, r, http.StatusForbidden, "intents", d)
			return
		}
	}
	f, err := operator.ParseListFilter(b.Resource, b.Status, b.Kind, b.Limit, q.Get("cursor"))
	if err == nil {
		f.Search, f.Since, f.Until = b.Search, b.Since, b.Until
		err = f.Validate()
	}
	if err != nil {
		d.Error = err.Error()
		s.render(w, r, http.StatusBadRequest, "intents", d)
		return
	}
	p, err := s.op.ListRows(r.Context(), f)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	counts, err := s.op.StatusCounts(r.Context(), f)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	b.Rows = p.Rows
	filters := url.Values{}
	for k, v := range map[string]string{"status": b.Status, "kind": b.Kind, "resource": b.Resource, "q": b.Search,
		"since": b.Since, "until": b.Until, "limit": b.Limit, "refresh": q.Get("refresh")} {
		if v != "" {
			filters.Set(k, v)
		}
	}
	// The tabs keep every filter but the status (and start at the first
	// page).
	all := statusTab{Label: "all", On: b.Status == ""}
	tabURL := func(st outbox.Status) string {
		u := cloneQuery(filters)
		u.Del("status")
		if st != "" {
			u.Set("status", string(st))
		}
		return pathWithQuery("/intents", u)
	}
	all.URL = tabURL("")
	b.Tabs = []statusTab{all}
	for _, c := range counts {
		b.Tabs[0].N += c.N
		b.Tabs[0].AtLeast = b.Tabs[0].AtLeast || c.AtLeast
		b.Tabs = append(b.Tabs, statusTab{Label: string(c.Status), Status: c.Status, N: c.N, AtLeast: c.AtLeast,
			URL: tabURL(c.Status), On: b.Status == string(c.Status)})
	}
	b.NextURL, b.FirstURL = pageLinks("/intents", filters, p.NextCursor, f.Cursor)
	s.render(w, r, http.StatusOK, "intents", d)
}

// intentBody is an intent's page.
type intentBody struct {
	D               *operator.IntentDetail
	Payload, Result string
	Key             *idempotency.Key
	KeyNote         string
	CanRetry        bool
	CanCancel       bool
	CanResolve      bool
	// Possible: the intent's effect may have happened; its retry form asks
	// for force, and a cancel is not offered (NoCancel says why).
	Possible bool
	NoCancel string
	// Note keeps what the operator typed when an action failed.
	Note string
}

// doneMessages are the flashes after a successful action (?done=…).
var doneMessages = map[string]string{
	string(operator.ActionRetry):   "Retried: the intent is pending again and will be relayed.",
	string(operator.ActionCancel):  "Cancelled.",
	string(operator.ActionResolve): "Resolved.",
}

// intentPage: GET /intents/{id}.
func (s *Server) intentPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	id, err := intentID(r)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	d := &pageData{Nav: "intents", Flash: doneMessages[r.URL.Query().Get("done")]}
	withRefresh(d, r.URL)
	s.showIntent(w, r, id, http.StatusOK, d, "")
}

// showIntent renders intent id's page with status (an action's error
// status, with d.Error set).
func (s *Server) showIntent(w http.ResponseWriter, r *http.Request, id int64, status int, d *pageData, note string) {
	det, err := s.op.Get(r.Context(), id)
	if err != nil {
		if d.Error != "" && errors.Is(err, outbox.ErrNotFound) {
			s.renderError(w, r, nil, status, d.Error)
			return
		}
		s.pageFail(w, r, err)
		return
	}
	// A scoped viewer sees intents of its resources only (the API's rule).
	v, ok := r.Context().Value(viewerKey{}).(*viewer)
	if !ok {
		s.pageFail(w, r, errors.New("admin: intent page without a viewer"))
		return
	}
	if err := v.intentResource(det.Resource); err != nil {
		s.pageFail(w, r, err)
		return
	}
	b := &intentBody{D: det, Payload: prettyJSON(det.Payload), Result: prettyJSON(det.Result), Note: note}
	b.CanRetry = operator.ActionRetry.AppliesTo(det.Status)
	b.CanCancel = operator.ActionCancel.AppliesTo(det.Status)
	b.CanResolve = operator.ActionResolve.AppliesTo(det.Status)
	b.Possible = det.Effect == outbox.EffectPossible
	if b.CanCancel && b.Possible {
		// The action would be refused (409): say why instead of offering it.
		b.CanCancel = false
		b.NoCancel = "Cancel is not offered: the effect may have happened, and a cancelled intent reads as one that did not. " +
			"Find out at the destination and resolve the intent with what you found."
		if det.Status == outbox.StatusPending {
			b.NoCancel = "Cancel is not offered: the effect may have happened, and a cancelled intent reads as one that did not. " +
				"Wait for its outcome; should it end unknown, find out at the destination and resolve it with what you found."
		}
	}
	if s.cfg.Store != nil && det.IdempotencyKey != "" {
		k, err := s.cfg.Store.Get(r.Context(), det.Kind, det.IdempotencyKey)
		switch {
		case errors.Is(err, idempotency.ErrNotFound):
			b.KeyNote = "no key row: not attempted yet, or completed and swept after its retention"
		case err != nil:
			b.KeyNote = "could not read the key: " + oneLine(err.Error())
		case !s.keyInScope(r.Context(), v, id, k):
			b.KeyNote = "The key is shared with an intent outside your token's scope (the global key scope lets resources share keys; --key-scope resource keeps them apart): its record is not shown."
		default:
			b.Key = k
		}
	}
	d.Title = fmt.Sprintf("Intent %d", id)
	d.Body = b
	s.render(w, r, status, "intent", d)
}

// keyInScope reports whether v may see key k's record from intent id's
// page: the intents that own and created it are id or of v's resources.
// Under the global key scope another resource's intent can hold the key,
// and its record (that intent, its last_error) is that resource's. An
// intent that cannot be read (swept) is taken as outside.
func (s *Server) keyInScope(ctx context.Context, v *viewer, id int64, k *idempotency.Key) bool {
	if v.scope.allResources() {
		return true
	}
	for _, other := range []int64{k.OwnerIntentID, k.FirstIntentID} {
		if other == id {
			continue
		}
		det, err := s.op.Get(ctx, other)
		if err != nil || v.intentResource(det.Resource) != nil {
			return false
		}
	}
	return true
}

func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

// intentActionPost: POST /intents/{id}/retry|cancel|resolve, a form with
// csrf, note, (resolve) outcome and (retry) force. Success: 303 to the
// intent's page. Failure: the intent's page with the error, with the API's
// status (409 for a status the action does not apply to, or an effect that
// may have happened).
func (s *Server) intentActionPost(w http.ResponseWriter, r *http.Request, v *viewer) {
	id, err := intentID(r)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	a := operator.Action(r.PathValue("action"))
	if a.AllowedFrom() == nil {
		s.renderError(w, r, nil, http.StatusNotFound, fmt.Sprintf("No such action %q: retry, cancel or resolve.", a))
		return
	}
	if !s.readForm(w, r, v, "the intent's page") {
		return
	}
	if !v.scope.allResources() {
		// The scope before the action; an intent's resource never changes.
		rec, err := s.cfg.Outbox.Get(r.Context(), id)
		if err == nil {
			err = v.intentResource(rec.Resource)
		}
		if err != nil {
			s.pageFail(w, r, err)
			return
		}
	}
	req := operator.ActionRequest{IntentID: id, Action: a, Actor: v.name, Note: strings.TrimSpace(r.PostFormValue("note")),
		Force: r.PostFormValue("force") != ""}
	if a == operator.ActionResolve {
		req.Outcome = outbox.Status(r.PostFormValue("outcome"))
	}
	if _, err := s.op.Apply(r.Context(), req); err != nil {
		ae := toAPIError(err)
		if ae.Status() >= 500 {
			s.cfg.Logger.Error("admin: page action failed", "action", a, "intent_id", id, "err", err)
		}
		msg := ae.Message
		var ise *operator.InvalidStateError
		switch {
		case errors.As(err, &ise) && ise.Effect != "" && a == ActionRetry:
			msg = fmt.Sprintf("Cannot retry intent %d without accepting a second effect: an attempt's outcome was lost, so the effect may have happened. "+
				"Find out at the destination and resolve it with what you found, or tick “accept a second effect” to retry anyway.", id)
		case ise != nil && ise.Effect != "":
			msg = fmt.Sprintf("Cannot %s intent %d: an attempt's outcome was lost, so the effect may have happened, and a cancelled intent reads as one that did not. "+
				"Find out at the destination and resolve it with what you found.", a, id)
		case ise != nil && ise.InFlight:
			msg = fmt.Sprintf("Cannot %s intent %d: it is in flight — an attempt has begun and has no outcome yet. "+
				"Wait for its outcome, or %s it once it is held unknown or failed.", a, id, a)
		case ise != nil:
			msg = fmt.Sprintf("Cannot %s intent %d: it is %s now; %s applies only to %s.", a, id, ise.Status, a, joinStatuses(ise.Allowed))
		}
		s.showIntent(w, r, id, ae.Status(), &pageData{Nav: "intents", Error: msg}, req.Note)
		return
	}
	s.cfg.Logger.Info("admin: operator action", "action", a, "intent_id", id, "actor", v.name)
	http.Redirect(w, r, fmt.Sprintf("/intents/%d?done=%s", id, a), http.StatusSeeOther)
}

// readForm reads a POSTed form, bounded by MaxBodyBytes, and checks it
// against cross-site request forgery. On failure it has answered (400, or
// 403 saying to reload page for a fresh form) and returns false.
func (s *Server) readForm(w http.ResponseWriter, r *http.Request, v *viewer, page string) bool {
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	if err := r.ParseForm(); err != nil {
		s.renderError(w, r, nil, http.StatusBadRequest, "The form could not be read: "+oneLine(err.Error()))
		return false
	}
	if !s.checkForm(r, v) {
		s.renderError(w, r, nil, http.StatusForbidden,
			"The form expired or came from another site (CSRF check failed): reload "+page+" and try again.")
		return false
	}
	return true
}

func joinStatuses(ss []outbox.Status) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = string(s)
	}
	return strings.Join(parts, ", ")
}

// bulkPost: POST /intents/bulk, a form with csrf, action, status, kind,
// resource, resource_prefix, since, until, outcome (resolve), note and
// step. Step
// preview (the default) is a dry run: the bulk page says how many intents
// the action would touch and offers to apply it; step apply runs it and
// redirects to the list of that status with what it changed. A viewer
// scoped to resources may not (as POST /api/v1/intents/bulk).
func (s *Server) bulkPost(w http.ResponseWriter, r *http.Request, v *viewer) {
	if !v.scope.allResources() {
		s.pageFail(w, r, forbidden("resource", "token %q is scoped to resources %s: bulk actions need an unscoped operator token", v.name, strings.Join(v.scope.Resources, ", ")))
		return
	}
	if !s.readForm(w, r, v, "the list") {
		return
	}
	f := r.PostFormValue
	req := operator.BulkRequest{Action: operator.Action(f("action")), Status: outbox.Status(f("status")), Kind: strings.TrimSpace(f("kind")),
		Resource: strings.TrimSpace(f("resource")), ResourcePrefix: strings.TrimSpace(f("resource_prefix")),
		Since: strings.TrimSpace(f("since")), Until: strings.TrimSpace(f("until")),
		Search: strings.TrimSpace(f("search")), Outcome: outbox.Status(f("outcome")), Note: strings.TrimSpace(f("note")), Actor: v.name}
	// The list's form has one action menu and one force box, labelled for
	// retry: the box means nothing to the other actions.
	req.Force = req.Action == operator.ActionRetry && f("force") != ""
	apply := f("step") == "apply"
	req.DryRun = !apply
	// The rows picked on the list (check boxes of the list's table that
	// belong to the bulk form).
	var err error
	for _, raw := range r.PostForm["id"] {
		id, perr := strconv.ParseInt(raw, 10, 64)
		if perr != nil || id < 1 {
			err = inputErr("ids", "%q is not an intent id", raw)
			break
		}
		req.IDs = append(req.IDs, id)
	}
	var res operator.BulkResult
	if err != nil {
		// Reported below, with the form.
	} else if req.Action == operator.ActionResolve && req.Outcome == "" {
		// The API's dry run counts without one; the page asks before it
		// offers to apply what could not run.
		err = inputErr("outcome", "resolve needs an outcome: succeeded or failed")
	} else {
		res, err = s.op.Bulk(r.Context(), req)
	}
	b := &bulkForm{Actions: bulkActions(req.Status), BulkRequest: req, Scope: bulkScope(req)}
	d := &pageData{Title: "Bulk " + string(req.Action), Nav: "intents", Body: b}
	if err != nil {
		ae := toAPIError(err)
		if ae.Status() >= 500 {
			s.cfg.Logger.Error("admin: page bulk action failed", "action", req.Action, "err", err)
		}
		d.Error = ae.Message
		s.render(w, r, ae.Status(), "bulk", d)
		return
	}
	if !apply {
		b.Preview = &res
		b.Possible = res.Skipped[operator.SkippedEffectPossible]
		b.Touch = max(0, res.Matched-b.Possible)
		s.render(w, r, http.StatusOK, "bulk", d)
		return
	}
	skipped := 0
	for _, n := range res.Skipped {
		skipped += n
	}
	s.cfg.Logger.Info("admin: bulk action", "action", req.Action, "status", req.Status, "matched", res.Matched,
		"applied", res.Applied, "skipped", skipped, "actor", v.name)
	q := url.Values{"status": {string(req.Status)}, "bulk": {string(req.Action)},
		"applied": {strconv.Itoa(res.Applied)}, "skipped": {strconv.Itoa(skipped)}}
	if n := res.Skipped[operator.SkippedEffectPossible]; n > 0 {
		q.Set("skipped_effect", strconv.Itoa(n))
	}
	if req.Kind != "" {
		q.Set("kind", req.Kind)
	}
	if req.Resource != "" {
		q.Set("resource", req.Resource)
	}
	if req.Search != "" {
		q.Set("q", req.Search)
	}
	// After a retry or a cancel the intents left the status: the list of
	// the status shows what is left.
	http.Redirect(w, r, pathWithQuery("/intents", q), http.StatusSeeOther)
}

// bulkScope says in words which intents req selects.
func bulkScope(req operator.BulkRequest) string {
	parts := []string{string(req.Status)}
	if req.Kind != "" {
		parts = append(parts, "kind "+req.Kind)
	}
	if req.Resource != "" {
		parts = append(parts, "resource "+strconv.Quote(req.Resource))
	}
	if req.ResourcePrefix != "" {
		parts = append(parts, "resource starting with "+strconv.Quote(req.ResourcePrefix))
	}
	if req.Since != "" {
		parts = append(parts, "changed since "+req.Since)
	}
	if req.Until != "" {
		parts = append(parts, "changed before "+req.Until)
	}
	if req.Search != "" {
		parts = append(parts, "matching "+strconv.Quote(req.Search))
	}
	if req.IDs != nil {
		n := len(req.IDs)
		parts = append(parts, fmt.Sprintf("among the %d picked on the list", n))
	}
	return strings.Join(parts, ", ")
}

// resourcesBody is the resources index.
type resourcesBody struct {
	Prefix   string
	Statuses []outbox.Status
	Rows     []resourceRow
	// NextURL is the next page; FirstURL the first, when this is not it.
	NextURL, FirstURL string
}

// resourceRow is a resource of the index with its counts, linked.
type resourceRow struct {
	operator.ResourceView
	Counts []statusCount
}

// resourcesPage: GET /resources?prefix=&cursor= lists the resources;
// GET /resources?resource=X is a jump to X's page (303), the header's box.
func (s *Server) resourcesPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	q := r.URL.Query()
	if res := strings.TrimSpace(q.Get("resource")); res != "" {
		if dotSegment(res) {
			s.resourcePageOf(w, r, v, res)
			return
		}
		http.Redirect(w, r, resourceURL(res), http.StatusSeeOther)
		return
	}
	b := &resourcesBody{Prefix: strings.TrimSpace(q.Get("prefix")), Statuses: operator.Statuses}
	d := &pageData{Title: "Resources", Nav: "resources", Body: b}
	withRefresh(d, r.URL)
	// A scoped viewer's index is read within its scope: left out after
	// the read, other resources still showed through the page (its cursor
	// was the last resource read, its count of those left out answered
	// whether any resource starts with a prefix).
	f := operator.ResourceFilter{Prefix: b.Prefix, Cursor: q.Get("cursor"), Within: v.scope.Resources}
	p, err := s.op.Resources(r.Context(), f)
	if err != nil {
		ae := toAPIError(err)
		if ae.Status() >= 500 {
			s.pageFail(w, r, err)
			return
		}
		d.Error = ae.Message
		s.render(w, r, ae.Status(), "resources", d)
		return
	}
	for _, rv := range p.Resources {
		if v.resource(rv.Resource) != nil {
			continue // never: the read kept to the scope
		}
		row := resourceRow{ResourceView: rv}
		for _, st := range operator.Statuses {
			row.Counts = append(row.Counts, statusCount{Status: st, N: rv.Counts[st],
				URL: pathWithQuery("/intents", url.Values{"resource": {rv.Resource}, "status": {string(st)}})})
		}
		b.Rows = append(b.Rows, row)
	}
	filters := url.Values{}
	if b.Prefix != "" {
		filters.Set("prefix", b.Prefix)
	}
	b.NextURL, b.FirstURL = pageLinks("/resources", filters, p.NextCursor, f.Cursor)
	s.render(w, r, http.StatusOK, "resources", d)
}

// statusCount is one cell of a resource's counts.
type statusCount struct {
	Status outbox.Status
	N      int64
	URL    string
}

// resourceBody is a resource's page.
type resourceBody struct {
	V          *operator.ResourceView
	Counts     []statusCount
	IntentsURL string
	Grants     []lease.Grant
	GrantsNote string
	Limit      int
}

// resourcePage: GET /resources/{id}.
func (s *Server) resourcePage(w http.ResponseWriter, r *http.Request, v *viewer) {
	s.resourcePageOf(w, r, v, r.PathValue("id"))
}

// resourcePageOf renders res's page.
func (s *Server) resourcePageOf(w http.ResponseWriter, r *http.Request, v *viewer, res string) {
	if err := v.resource(res); err != nil {
		s.pageFail(w, r, err)
		return
	}
	rv, err := s.op.Resource(r.Context(), res)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	b := &resourceBody{V: rv, IntentsURL: pathWithQuery("/intents", url.Values{"resource": {res}}), Limit: lease.DefaultHistoryLimit}
	for _, st := range operator.Statuses {
		b.Counts = append(b.Counts, statusCount{Status: st, N: rv.Counts[st],
			URL: pathWithQuery("/intents", url.Values{"resource": {res}, "status": {string(st)}})})
	}
	grants, err := s.op.Epochs(r.Context(), res, 0)
	if err != nil {
		b.GrantsNote = "could not read the epoch history: " + oneLine(err.Error())
	} else {
		b.Grants = grants
		if len(grants) == 0 {
			b.GrantsNote = "No grants recorded (epochs granted before the history existed are not listed)."
		}
	}
	d := &pageData{Title: "Resource " + res, Nav: "resources", Body: b}
	withRefresh(d, r.URL)
	s.render(w, r, http.StatusOK, "resource", d)
}
