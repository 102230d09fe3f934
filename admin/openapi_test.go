package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/fencegate/fencegate/docs"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// specURL is where the description is registered with the schema compiler.
const specURL = "mem:///openapi.json"

// spec is docs/openapi.yaml, its schemas compiled, its operations
// findable by request.
type spec struct {
	doc map[string]any
	c   *jsonschema.Compiler
	ops map[string]*specOp // "GET /api/v1/intents/{id}"
	mux *http.ServeMux     // the description's paths, matched as the server matches them
}

type specOp struct {
	key, method, path string
	role              string // x-fencegate-role: worker, operator, none
	params            []specParam
	body              *jsonschema.Schema // nil: no request body
	bodyRequired      bool
	responses         map[string]*specResponse // "200" → …
}

type specParam struct {
	name, in string
	required bool
	schema   *jsonschema.Schema
}

type specResponse struct {
	content map[string]*jsonschema.Schema // media type → schema
	headers map[string]specHeader
}

type specHeader struct {
	required bool
	schema   *jsonschema.Schema
}

// pointer escapes JSON-pointer tokens into a fragment.
func pointer(tokens ...string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}

// loadSpec reads the description as the server serves it (docs.OpenAPIJSON).
func loadSpec(t testing.TB) *spec {
	t.Helper()
	raw, err := docs.OpenAPIJSON()
	if err != nil {
		t.Fatalf("docs/openapi.yaml does not convert to JSON: %v", err)
	}
	return parseSpec(t, raw)
}

func parseSpec(t testing.TB, raw []byte) *spec {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	doc, ok := inst.(map[string]any)
	if !ok || doc["openapi"] != "3.1.0" {
		t.Fatalf("the description is not an OpenAPI 3.1.0 document: openapi = %v", doc["openapi"])
	}
	sp := &spec{doc: doc, c: jsonschema.NewCompiler(), ops: map[string]*specOp{}, mux: http.NewServeMux()}
	sp.c.DefaultDraft(jsonschema.Draft2020)
	sp.c.AssertFormat()
	if err := sp.c.AddResource(specURL, doc); err != nil {
		t.Fatal(err)
	}
	paths, _ := doc["paths"].(map[string]any)
	for path, item := range paths {
		for method, opv := range item.(map[string]any) {
			op, ok := opv.(map[string]any)
			if !ok || !slices.Contains([]string{"get", "post", "put", "patch", "delete"}, method) {
				continue
			}
			so := &specOp{key: strings.ToUpper(method) + " " + path, method: strings.ToUpper(method), path: path,
				responses: map[string]*specResponse{}}
			so.role, _ = op["x-fencegate-role"].(string)
			if so.role == "" {
				t.Errorf("%s: no x-fencegate-role", so.key)
			}
			base := []string{"paths", path, method}
			at := func(tokens ...string) []string { return append(slices.Clone(base), tokens...) }
			for i, pv := range asList(op["parameters"]) {
				p, ptr := sp.deref(pv, at("parameters", strconv.Itoa(i))...)
				req, _ := p["required"].(bool)
				sch := sp.compile(t, append(slices.Clone(ptr), "schema")...)
				if sch == nil {
					t.Errorf("%s: parameter %v has no schema", so.key, p["name"])
				}
				so.params = append(so.params, specParam{name: p["name"].(string), in: p["in"].(string), required: req, schema: sch})
			}
			if rb, ok := op["requestBody"]; ok {
				b, ptr := sp.deref(rb, at("requestBody")...)
				so.bodyRequired, _ = b["required"].(bool)
				so.body = sp.compile(t, append(slices.Clone(ptr), "content", "application/json", "schema")...)
			}
			for status, rv := range op["responses"].(map[string]any) {
				r, ptr := sp.deref(rv, at("responses", status)...)
				sr := &specResponse{content: map[string]*jsonschema.Schema{}, headers: map[string]specHeader{}}
				for mt := range asMap(r["content"]) {
					sr.content[mt] = sp.compile(t, append(slices.Clone(ptr), "content", mt, "schema")...)
				}
				for name, hv := range asMap(r["headers"]) {
					h, hptr := sp.deref(hv, append(slices.Clone(ptr), "headers", name)...)
					req, _ := h["required"].(bool)
					sr.headers[name] = specHeader{required: req, schema: sp.compile(t, append(slices.Clone(hptr), "schema")...)}
				}
				so.responses[status] = sr
			}
			sp.ops[so.key] = so
			sp.mux.Handle(so.key, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				m := r.Context().Value(matchKey{}).(*match)
				m.op = so
				for _, p := range so.params {
					if p.in == "path" {
						m.path[p.name] = r.PathValue(p.name)
					}
				}
			}))
		}
	}
	if len(sp.ops) == 0 {
		t.Fatal("the description has no operations")
	}
	return sp
}

func asList(v any) []any { l, _ := v.([]any); return l }

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }

// deref follows a "$ref" to components (a parameter, a response, a
// header), returning the object and its pointer.
func (sp *spec) deref(v any, ptr ...string) (map[string]any, []string) {
	m := v.(map[string]any)
	ref, ok := m["$ref"].(string)
	if !ok {
		return m, ptr
	}
	tokens := strings.Split(strings.TrimPrefix(ref, "#/"), "/")
	cur := any(sp.doc)
	for i, tok := range tokens {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		tokens[i] = tok
		cur = cur.(map[string]any)[tok]
	}
	return sp.deref(cur, tokens...)
}

// compile compiles the schema at the pointer; nil when there is none.
func (sp *spec) compile(t testing.TB, ptr ...string) *jsonschema.Schema {
	t.Helper()
	ptr = slices.Clone(ptr)
	cur := any(sp.doc)
	for _, tok := range ptr {
		switch v := cur.(type) {
		case map[string]any:
			var ok bool
			if cur, ok = v[tok]; !ok {
				return nil
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i >= len(v) {
				return nil
			}
			cur = v[i]
		default:
			return nil
		}
	}
	s, err := sp.c.Compile(specURL + "#" + (&url.URL{Fragment: pointer(ptr...)}).EscapedFragment())
	if err != nil {
		t.Fatalf("compile the schema at %s: %v", pointer(ptr...), err)
	}
	return s
}

type matchKey struct{}

type match struct {
	op   *specOp
	path map[string]string
}

// find returns the operation the description has for r, and its path
// values; nil when no path and method of the description match.
func (sp *spec) find(r *http.Request) (*specOp, map[string]string) {
	m := &match{path: map[string]string{}}
	sp.mux.ServeHTTP(httptest.NewRecorder(), r.WithContext(context.WithValue(r.Context(), matchKey{}, m)))
	return m.op, m.path
}

// checkRequest reports why r (with body) is not valid by the description;
// nil when it is.
func (sp *spec) checkRequest(op *specOp, pathVals map[string]string, r *http.Request, body []byte) error {
	q := r.URL.Query()
	for name := range q {
		if !slices.ContainsFunc(op.params, func(p specParam) bool { return p.in == "query" && p.name == name }) {
			return fmt.Errorf("query parameter %q is not described", name)
		}
	}
	for _, p := range op.params {
		var vals []string
		switch p.in {
		case "path":
			vals = []string{pathVals[p.name]}
		case "query":
			vals = q[p.name]
		case "header":
			vals = r.Header.Values(p.name)
		}
		if len(vals) == 0 {
			if p.required {
				return fmt.Errorf("%s parameter %q is required", p.in, p.name)
			}
			continue
		}
		if len(vals) > 1 {
			return fmt.Errorf("%s parameter %q given %d times", p.in, p.name, len(vals))
		}
		if err := p.schema.Validate(vals[0]); err != nil {
			return fmt.Errorf("%s parameter %q: %v", p.in, p.name, err)
		}
	}
	if len(body) == 0 {
		if op.body != nil && op.bodyRequired {
			return errors.New("the request body is required")
		}
		return nil
	}
	if op.body == nil {
		return errors.New("the operation takes no request body")
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return fmt.Errorf("content type %q is not application/json", r.Header.Get("Content-Type"))
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("the body is not JSON: %v", err)
	}
	if err := op.body.Validate(v); err != nil {
		return fmt.Errorf("the body: %v", err)
	}
	return nil
}

// checkResponse reports how an answer departs from the description.
func (sp *spec) checkResponse(op *specOp, code int, hdr http.Header, body []byte) error {
	if op == nil {
		// A path or method the API does not have: 404 or 405, as errors.
		if code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
			return fmt.Errorf("an undescribed request answered %d, not 404 or 405", code)
		}
		return sp.checkBody(sp.compileError(), hdr, body)
	}
	r, ok := op.responses[strconv.Itoa(code)]
	if !ok {
		return fmt.Errorf("status %d of %s is not in the description", code, op.key)
	}
	for name, h := range r.headers {
		v := hdr.Get(name)
		if v == "" {
			if h.required {
				return fmt.Errorf("status %d of %s: header %s is missing", code, op.key, name)
			}
			continue
		}
		if h.schema != nil {
			if err := h.schema.Validate(v); err != nil {
				return fmt.Errorf("status %d of %s: header %s: %v", code, op.key, name, err)
			}
		}
	}
	if len(r.content) == 0 {
		if len(body) > 0 {
			return fmt.Errorf("status %d of %s: a body where the description has none", code, op.key)
		}
		return nil
	}
	mt, _, err := mime.ParseMediaType(hdr.Get("Content-Type"))
	if err != nil {
		return fmt.Errorf("status %d of %s: content type %q: %v", code, op.key, hdr.Get("Content-Type"), err)
	}
	s, ok := r.content[mt]
	if !ok {
		return fmt.Errorf("status %d of %s: content type %q is not in the description", code, op.key, mt)
	}
	if err := sp.checkBody(s, hdr, body); err != nil {
		return fmt.Errorf("status %d of %s: %v", code, op.key, err)
	}
	return nil
}

func (sp *spec) compileError() *jsonschema.Schema {
	s, err := sp.c.Compile(specURL + "#/components/schemas/Error")
	if err != nil {
		panic(err)
	}
	return s
}

func (sp *spec) checkBody(s *jsonschema.Schema, hdr http.Header, body []byte) error {
	mt, _, _ := mime.ParseMediaType(hdr.Get("Content-Type"))
	if mt != "application/json" {
		return nil
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("the body is not JSON: %v: %q", err, body)
	}
	if s == nil {
		return nil
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("the body %s does not match its schema: %v", body, err)
	}
	return nil
}

// walker sends requests to running servers and holds every exchange to
// the description.
type walker struct {
	t  *testing.T
	sp *spec

	mu   sync.Mutex
	seen map[string]map[int]int // operation → status → answers
	n    int
}

// call is one request of the walk.
type call struct {
	method, path, token, body string
	base                      string // the server's URL; default the walk's main server
	host                      string // a Host header other than the URL's
	header                    http.Header
	ctype                     string // default application/json when there is a body
	noCtype                   bool
	want                      int    // the status expected (0: any the description has)
	wantCode                  string // the error code expected
	// schema says what the description must think of the request:
	// "valid" (and then the server must not answer 400) or "invalid".
	schema string
	// beyond says why the server refuses a request the description admits
	// (a rule JSON Schema cannot say), or accepts one it does not; without
	// it either is a failure.
	beyond string
}

func (w *walker) do(c call) resp {
	t := w.t
	t.Helper()
	var rd io.Reader
	if c.body != "" {
		rd = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, c.base+c.path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if c.body != "" && !c.noCtype {
		req.Header.Set("Content-Type", cmpOr(c.ctype, "application/json"))
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for k, vs := range c.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if c.host != "" {
		req.Host = c.host
	}
	op, pathVals := w.sp.find(req)
	var reqErr error
	if op != nil {
		reqErr = w.sp.checkRequest(op, pathVals, req, []byte(c.body))
	}
	what := c.method + " " + c.path
	switch {
	case c.schema == "valid" && reqErr != nil:
		t.Errorf("%s %s: the description refuses a request meant to be valid: %v", what, c.body, reqErr)
	case c.schema == "invalid" && op != nil && reqErr == nil:
		t.Errorf("%s %s: the description admits a request meant to be invalid", what, c.body)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	r := resp{code: res.StatusCode, raw: string(b), hdr: res.Header}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		_ = json.Unmarshal(b, &r.obj)
	}
	if err := w.sp.checkResponse(op, res.StatusCode, res.Header, b); err != nil {
		t.Errorf("%s: %v", what, err)
	}
	if c.want != 0 && r.code != c.want {
		t.Errorf("%s %s: status %d, want %d: %s", what, c.body, r.code, c.want, r.raw)
	}
	if c.wantCode != "" && r.errField("code") != c.wantCode {
		t.Errorf("%s %s: error %s, want code %s", what, c.body, r.raw, c.wantCode)
	}
	// The request's fate against the description's verdict on it: the
	// server refuses as bad input what the description admits, or takes
	// what it refuses — each a rule missing from one or the other.
	if op != nil && c.beyond == "" && r.code != http.StatusUnauthorized && r.code != http.StatusForbidden &&
		r.code != http.StatusMisdirectedRequest && r.code != http.StatusTooManyRequests {
		switch {
		case reqErr == nil && r.code == http.StatusBadRequest:
			t.Errorf("%s %s: the description admits it, the server refuses it: %s", what, c.body, r.raw)
		case reqErr != nil && r.code < 300:
			t.Errorf("%s %s: the description refuses it (%v), the server answers %d", what, c.body, reqErr, r.code)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n++
	key := "(undescribed)"
	if op != nil {
		key = op.key
	}
	if w.seen[key] == nil {
		w.seen[key] = map[int]int{}
	}
	w.seen[key][r.code]++
	return r
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// concrete fills an operation's path with values of the walk.
func concrete(path string, id string) string {
	return strings.ReplaceAll(path, "{id}", id)
}

// The tokens of the walk's servers: the two of testTokens, and two
// confined ones.
const (
	scopedWorkerSecret   = "scoped-worker-secret-0123456789"
	scopedOperatorSecret = "scoped-operator-secret-0123456789"
)

var walkTokens = append(slices.Clone(testTokens),
	Token{Name: "w-scoped", Role: RoleWorker, Secret: scopedWorkerSecret, Resources: []string{"scoped-*"}, Kinds: []string{"file"}},
	Token{Name: "op-scoped", Role: RoleOperator, Secret: scopedOperatorSecret, Resources: []string{"scoped-*"}},
)

// TestOpenAPIRoutesAreTheMux: the routes the server registers for its
// API are the description's operations, no more and no fewer, and the
// pages' routes are none of the API's paths.
func TestOpenAPIRoutesAreTheMux(t *testing.T) {
	t.Parallel()
	sp := loadSpec(t)
	pool := testdb.New(t)
	s := newServer(t, pool, testTokens, nil)
	var api, pages []string
	for _, r := range s.mux.routes {
		switch r.group {
		case routeAPI:
			api = append(api, r.pattern)
		case routePage:
			pages = append(pages, r.pattern)
		default:
			t.Errorf("route %q registered outside routes() and pageRoutes()", r.pattern)
		}
	}
	var described []string
	for key := range sp.ops {
		described = append(described, key)
	}
	sort.Strings(api)
	sort.Strings(described)
	t.Logf("%d API routes registered, %d operations described, %d page routes", len(api), len(described), len(pages))
	if len(api) == 0 || len(pages) == 0 {
		t.Fatal("no routes counted")
	}
	for _, r := range api {
		if !slices.Contains(described, r) {
			t.Errorf("route %q is registered but not in docs/openapi.yaml", r)
		}
	}
	for _, d := range described {
		if !slices.Contains(api, d) {
			t.Errorf("operation %q is in docs/openapi.yaml but the server has no such route", d)
		}
	}
	for _, p := range pages {
		_, path, _ := strings.Cut(p, " ")
		if strings.HasPrefix(path, "/api/") || slices.Contains([]string{"/healthz", "/readyz", "/metrics"}, path) {
			t.Errorf("page route %q is on a path of the API: register it in routes() and describe it", p)
		}
	}
}

// TestOpenAPIErrorCodes: the description's error codes are errmap's, and
// every code the API gives has a response of its status that admits it.
func TestOpenAPIErrorCodes(t *testing.T) {
	t.Parallel()
	sp := loadSpec(t)
	var enum []string
	for _, v := range asList(asMap(asMap(asMap(sp.doc["components"])["schemas"])["ErrorCode"])["enum"]) {
		enum = append(enum, v.(string))
	}
	var codes []string
	for _, c := range errmap.Codes() {
		codes = append(codes, string(c))
	}
	sort.Strings(enum)
	if !slices.Equal(enum, codes) {
		t.Errorf("ErrorCode's enum %v, errmap's codes %v", enum, codes)
	}
	checked := 0
	for _, c := range errmap.Codes() {
		switch c {
		case errmap.UnsafeDatabase, errmap.MethodNotAllowed:
			// The CLI's only; the answer to a method no operation has
			// (checked by the walk against the Error schema).
			continue
		}
		// Every extra field any code carries, so that only the code and
		// the status decide.
		inst := map[string]any{"error": map[string]any{"code": string(c), "message": "m", "field": "f", "resource": "r",
			"supplied_epoch": json.Number("1"), "current_epoch": json.Number("2"), "holder": "h", "expires_at": "2026-01-01T00:00:00Z",
			"operation_id": "o", "intent_id": json.Number("1"), "action": "retry", "status": "failed", "allowed": []any{"failed"},
			"effect": "possible", "principal": "p", "reason": "x", "recorded_system_identifier": "1", "system_identifier": "2",
			"recorded_timeline": json.Number("1"), "timeline": json.Number("2")}}
		status := strconv.Itoa(c.Status())
		var where []string
		for _, op := range sp.ops {
			r, ok := op.responses[status]
			if !ok || r.content["application/json"] == nil {
				continue
			}
			if r.content["application/json"].Validate(inst) == nil {
				where = append(where, op.key)
			}
		}
		if len(where) == 0 {
			t.Errorf("no response %s of the description admits error code %s", status, c)
		}
		checked++
	}
	t.Logf("%d codes, %d with a response of their status", len(codes), checked)
	if checked == 0 {
		t.Fatal("no code checked")
	}
}

// TestOpenAPIServed: GET /api/v1/openapi.json is docs/openapi.yaml as
// JSON, without a token.
func TestOpenAPIServed(t *testing.T) {
	e := setup(t)
	want, err := docs.OpenAPIJSON()
	if err != nil {
		t.Fatal(err)
	}
	r := doReq(t, e.ts.URL, "GET", "/api/v1/openapi.json", "", "", "")
	if r.code != http.StatusOK || r.raw != string(want) || !strings.HasPrefix(r.hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("openapi.json = %d %q (%d bytes), want the description's %d bytes", r.code, r.hdr.Get("Content-Type"), len(r.raw), len(want))
	}
	parseSpec(t, []byte(r.raw))
}

// TestOpenAPIWalk walks every operation of the description on running
// servers (real PostgreSQL, real NATS): requests the description admits
// are accepted, those it refuses are refused, every answer's status is
// in the description and its body matches the schema. It fails when a
// route or a status the server answers is missing from the description.
func TestOpenAPIWalk(t *testing.T) {
	t.Parallel()
	sp := loadSpec(t)
	w := &walker{t: t, sp: sp, seen: map[string]map[int]int{}}
	pool := testdb.New(t)

	ns := natstest.Start(t)
	nc := natstest.Connect(t, ns.URL)
	natsReady := func() error {
		if nc.Status() != nats.CONNECTED {
			return errors.New(nc.Status().String())
		}
		return nil
	}
	s := newServer(t, pool, walkTokens, func(c *Config) {
		c.NATSReady = natsReady
		c.Issuer = lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()), lease.WithLockTimeout(200*time.Millisecond))
		ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema(), LockTimeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		c.Outbox = ob
	})
	main := serveURL(t, s)
	e := &env{t: t, pool: pool, srv: s, issuer: s.cfg.Issuer, ob: s.cfg.Outbox}
	// Without tokens: anonymous, loopback Host only.
	open := serveURL(t, newServer(t, pool, nil, func(c *Config) { c.NATSReady = natsReady }))
	// One failed authentication limits the address.
	limited := serveURL(t, newServer(t, pool, walkTokens, func(c *Config) { c.AuthFailureLimit = 1; c.AuthFailureWindow = time.Hour }))
	// PostgreSQL unreachable.
	down := serveURL(t, newServer(t, unreachablePool(t), walkTokens, func(c *Config) {
		c.NATSReady = func() error { return errors.New("nats: no servers available") }
	}))

	tokenFor := map[string]string{"worker": workerSecret, "operator": operatorSecret}
	otherRole := map[string]string{"worker": operatorSecret, "operator": workerSecret}
	opKeys := make([]string, 0, len(sp.ops))
	for k := range sp.ops {
		opKeys = append(opKeys, k)
	}
	sort.Strings(opKeys)

	// Every operation: the answers every route gives alike. The limited
	// server's one failure is spent first: every route is 429 after it.
	w.do(call{base: limited, method: "GET", path: "/metrics", token: "not-a-token-0123456789", want: 401})
	for _, k := range opKeys {
		op := sp.ops[k]
		path := concrete(op.path, "1")
		if op.role != "none" {
			w.do(call{base: main, method: op.method, path: path, want: 401, wantCode: "unauthorized"})
			w.do(call{base: main, method: op.method, path: path, token: otherRole[op.role], want: 403, wantCode: "forbidden"})
			w.do(call{base: limited, method: op.method, path: path, token: "not-a-token-0123456789", want: 429, wantCode: "too_many_failures"})
		}
		if op.path != "/healthz" {
			w.do(call{base: open, method: op.method, path: path, host: "rebind.example.com", want: 421, wantCode: "misdirected"})
		}
		r := w.do(call{base: down, method: op.method, path: path, token: tokenFor[op.role], body: minimalBody[k]})
		if strings.HasPrefix(op.path, "/api/v1/") && op.path != "/api/v1/openapi.json" && r.code != http.StatusServiceUnavailable {
			t.Errorf("%s without PostgreSQL: %d %s, want 503", k, r.code, r.raw)
		}
	}

	W, O := workerSecret, operatorSecret
	post := func(c call) resp {
		c.method, c.base = cmpOr(c.method, "POST"), cmpOr(c.base, main)
		return w.do(c)
	}
	get := func(c call) resp {
		c.method, c.base = "GET", cmpOr(c.base, main)
		return w.do(c)
	}

	// Probes and the description.
	get(call{path: "/healthz", want: 200})
	get(call{path: "/readyz", want: 200})
	get(call{path: "/metrics", token: O, want: 200})
	get(call{path: "/api/v1/openapi.json", want: 200})
	get(call{base: open, path: "/api/v1/openapi.json", want: 200})

	// Leases and epochs.
	r := post(call{path: "/api/v1/leases", token: W, body: `{"resource":"walk-a","holder":"h1","ttl_ms":60000}`, schema: "valid", want: 201})
	ea := num(r.obj["epoch"])
	post(call{path: "/api/v1/leases", token: W, body: `{"resource":"walk-a","holder":"h2","ttl_ms":60000}`, schema: "valid", want: 409, wantCode: "lease_held"})
	post(call{path: "/api/v1/leases", token: W, body: `{"resource":"walk-a","holder":"h1","ttl_ms":5}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/leases", token: W, body: `{"resource":"walk-a","holder":"h1"}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/leases", token: W, body: `{"resource":"walk-a","holder":"h1","ttl_ms":1000,"epoch":3}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/leases", token: W, body: `{"resource":"walk\u0007a","holder":"h1","ttl_ms":1000}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/leases", token: W, body: `[1]`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/leases", token: W, body: `{"resource":"walk-a","holder":"h1","ttl_ms":1000}`, ctype: "text/plain", schema: "invalid", want: 400})
	post(call{path: "/api/v1/leases", token: W, body: `{"resource":"walk-a","holder":"h1","ttl_ms":1000,"x":"` + strings.Repeat("x", 2<<20) + `"}`,
		schema: "invalid", want: 400, wantCode: "body_too_large"})
	post(call{path: "/api/v1/leases", token: scopedWorkerSecret, body: `{"resource":"walk-a","holder":"h1","ttl_ms":1000}`, schema: "valid", want: 403})
	post(call{path: "/api/v1/leases/renew", token: W, body: fmt.Sprintf(`{"resource":"walk-a","holder":"h1","epoch":%d,"ttl_ms":60000}`, ea), schema: "valid", want: 200})
	post(call{path: "/api/v1/leases/renew", token: W, body: fmt.Sprintf(`{"resource":"walk-a","holder":"h1","epoch":%d,"ttl_ms":60000}`, ea+5), schema: "valid", want: 409, wantCode: "stale_epoch"})
	post(call{path: "/api/v1/leases/renew", token: W, body: `{"resource":"walk-a","holder":"h1","ttl_ms":60000}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/leases/release", token: W, body: fmt.Sprintf(`{"resource":"walk-a","holder":"h1","epoch":%d}`, ea+5), schema: "valid", want: 409})
	post(call{path: "/api/v1/leases/release", token: W, body: fmt.Sprintf(`{"resource":"walk-a","holder":"h1","epoch":%d}`, ea), schema: "valid", want: 200})
	post(call{path: "/api/v1/leases/release", token: W, body: `{"resource":"walk-a","holder":"h1","epoch":0}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/epochs", token: W, body: `{"resource":"walk-b","epoch":5}`, schema: "valid", want: 201})
	post(call{path: "/api/v1/epochs", token: W, body: `{"resource":"walk-b","epoch":5}`, schema: "valid", want: 200})
	post(call{path: "/api/v1/epochs", token: W, body: `{"resource":"walk-b","epoch":3}`, schema: "valid", want: 409, wantCode: "stale_epoch"})
	post(call{path: "/api/v1/epochs", token: W, body: `{"resource":"walk-b","epoch":9007199254740993}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/epochs", token: scopedWorkerSecret, body: `{"resource":"scoped-b","epoch":5}`, schema: "valid", want: 403})
	post(call{base: open, path: "/api/v1/epochs", body: `{"resource":"walk-c","epoch":2}`, schema: "valid", want: 201})

	// Enqueue: each kind, the duplicate, the conflict, the fence.
	enq := func(op, kind, payload string) string {
		return fmt.Sprintf(`{"resource":"walk-b","epoch":5,"operation_id":%q,"kind":%q,"payload":%s}`, op, kind, payload)
	}
	email := `{"to":["Alice <alice@example.com>","bob@example.com"],"cc":"carol@example.com","from":"reports@example.com","subject":"Nightly","text":"body"}`
	r = post(call{path: "/api/v1/intents", token: W, body: enq("e1", "email", email), schema: "valid", want: 201})
	emailID := num(r.obj["intent_id"])
	post(call{path: "/api/v1/intents", token: W, body: enq("e1", "email", email), schema: "valid", want: 200})
	post(call{path: "/api/v1/intents", token: W, body: enq("e1", "email", `{"to":"x@example.com","from":"reports@example.com","subject":"Other","html":"<p>b</p>"}`),
		schema: "valid", want: 422, wantCode: "conflict"})
	post(call{path: "/api/v1/intents", token: W, body: `{"resource":"walk-b","epoch":4,"operation_id":"e2","kind":"email","payload":` + email + `}`,
		schema: "valid", want: 409, wantCode: "stale_epoch"})
	valid := map[string][]string{
		"email": {`{"to":"a@example.com","from":"Ops Team <ops@example.com>","subject":"s","html":"<b>x</b>"}`},
		"file":  {`{"target":"reports/2026/daily.csv","content":"a,b\n"}`, `{"target":"x.bin","content_base64":"AAEC"}`},
		"webhook": {`{"url":"https://hooks.example.com/in?x=1","method":"PUT","headers":{"X-Trace":"abc","Authorization":{"secret":"HOOK_TOKEN"}},"body":{"n":1}}`,
			`{"url":"http://127.0.0.1:9/x","body_base64":"aGk=","content_type":"text/plain","lookup_url":"http://127.0.0.1:9/x/status"}`},
		"s3": {`{"key":"reports/a.csv","content":"x","content_type":"text/csv","metadata":{"run":"7"}}`, `{"bucket":"my-bucket","key":"b","content_base64":"AA=="}`},
	}
	invalid := map[string][]string{
		"email": {`{"to":[],"from":"a@example.com","subject":"s","text":"t"}`, `{"to":"not an address","from":"a@example.com","subject":"s","text":"t"}`,
			`{"to":"a@example.com","from":"a@example.com","subject":"two\nlines","text":"t"}`, `{"to":"a@example.com","from":"a@example.com","subject":"s"}`,
			`{"to":"a@example.com","from":"a@example.com","subject":"  ","text":"t"}`,
			`{"to":"a@example.com","Bcc":"boss@example.com","from":"a@example.com","subject":"s","text":"t"}`, `{"To":"a@example.com","from":"a@example.com","subject":"s","text":"t"}`},
		"file": {`{"target":"../etc/passwd","content":"x"}`, `{"target":"/abs","content":"x"}`, `{"target":"a//b","content":"x"}`,
			`{"target":"-rf","content":"x"}`, `{"target":"d/.x.FenceGate.manifest","content":"x"}`, `{"target":"a","content":"x","content_base64":"AA=="}`,
			`{"target":"a"}`, `{"target":"a","content_base64":"!!"}`, `{"target":"a/","content":"x"}`, `{"target":"a/./b","content":"x"}`,
			`{"target":"a","content":"x","extra":true}`, `{"Target":"a","content":"x"}`},
		"webhook": {`{"url":"ftp://x.example.com/"}`, `{"url":"https://user:pw@x.example.com/"}`, `{"url":"https://x.example.com/#f"}`,
			`{"url":"https://x.example.com/","headers":{"Authorization":"Bearer abc"}}`, `{"url":"https://x.example.com/","headers":{"X-Note":"bearer abc"}}`,
			`{"url":"https://x.example.com/","headers":{"idempotency-key":"k"}}`, `{"url":"https://x.example.com/","headers":{"Content-Type":"text/plain"}}`,
			`{"url":"https://x.example.com/","headers":{"Bad Name":"v"}}`, `{"url":"https://x.example.com/","body":1,"body_base64":"AA==","content_type":"a/b"}`,
			`{"url":"https://x.example.com/","body_base64":"AA=="}`, `{"url":"https://x.example.com/","content_type":"a/b"}`,
			`{"url":"https://x.example.com/","method":"GET"}`, `{"url":"https://x.example.com/","header":{}}`},
		"s3": {`{"key":".fencegate/receipts/x","content":"x"}`, `{"key":".FENCEGATE. /x","content":"x"}`, `{"bucket":"AB","key":"k","content":"x"}`,
			`{"key":"k","content":"x","metadata":{"Upper":"v"}}`, `{"key":"k","content":"x","metadata":{"fencegate-x":"v"}}`, `{"key":"k"}`,
			`{"key":"k","content":"x","extra":1}`},
	}
	n := 0
	for kind, payloads := range valid {
		for _, p := range payloads {
			n++
			post(call{path: "/api/v1/intents", token: W, body: enq(fmt.Sprintf("v%d", n), kind, p), schema: "valid", want: 201})
		}
	}
	for kind, payloads := range invalid {
		for _, p := range payloads {
			n++
			r := post(call{path: "/api/v1/intents", token: W, body: enq(fmt.Sprintf("i%d", n), kind, p), schema: "invalid", want: 400})
			if f, _ := r.errField("field").(string); !strings.HasPrefix(f, "payload") {
				t.Errorf("%s payload %s: field %q, want one under payload", kind, p, f)
			}
		}
	}
	post(call{path: "/api/v1/intents", token: W, body: enq("k1", "nosuchkind", `{}`), schema: "valid", want: 400,
		beyond: "the kinds are the gateway's registered adapters"})
	post(call{path: "/api/v1/intents", token: W, body: enq("k2", "email", email)[:40], schema: "invalid", want: 400})
	post(call{path: "/api/v1/intents", token: W, body: `{"resource":"walk-b","epoch":5,"kind":"email","payload":` + email + `}`, schema: "valid", want: 400,
		beyond: "the operation id is operation_id or the Idempotency-Key header: one of them is required"})
	post(call{path: "/api/v1/intents", token: W, body: `{"resource":"walk-b","epoch":5,"kind":"email","payload":` + email + `}`, schema: "valid", want: 201,
		header: http.Header{"Idempotency-Key": {"hdr-1"}}})
	post(call{path: "/api/v1/intents", token: W, body: `{"resource":"walk-b","epoch":5,"kind":"email","payload":` + email + `}`, schema: "valid", want: 200,
		header: http.Header{"Idempotency-Key": {`"hdr-1"`}}})
	post(call{path: "/api/v1/intents", token: W, body: enq("hdr-2", "email", email), schema: "valid", want: 400, wantCode: "invalid_input",
		header: http.Header{"Idempotency-Key": {"hdr-3"}}, beyond: "the header and operation_id must be equal when both are given"})
	post(call{path: "/api/v1/intents", token: W, body: enq("hdr-4", "email", email), schema: "invalid", want: 400,
		header: http.Header{"Idempotency-Key": {`"unterminated`}}})
	post(call{path: "/api/v1/intents", token: W, body: enq("big", "file", `{"target":"big","content":"`+strings.Repeat("x", 300<<10)+`"}`), schema: "valid", want: 400,
		beyond: "a payload is at most 256 KiB"})
	post(call{path: "/api/v1/intents", token: scopedWorkerSecret, body: enq("sc1", "file", `{"target":"a","content":"x"}`), schema: "valid", want: 403})
	post(call{path: "/api/v1/intents", token: scopedWorkerSecret,
		body: `{"resource":"scoped-b","epoch":1,"operation_id":"sc2","kind":"email","payload":` + email + `}`, schema: "valid", want: 403})
	post(call{base: open, path: "/api/v1/intents", body: `{"resource":"walk-c","epoch":2,"operation_id":"anon","kind":"email","payload":` + email + `}`,
		schema: "valid", want: 201})

	// Reads.
	get(call{path: "/api/v1/intents", token: O, schema: "valid", want: 200})
	r = get(call{path: "/api/v1/intents?status=pending&limit=2&kind=email&resource=walk-b", token: O, schema: "valid", want: 200})
	if c, _ := r.obj["next_cursor"].(string); c == "" {
		t.Errorf("a page of 2 of more intents has no next_cursor: %s", r.raw)
	} else {
		get(call{path: "/api/v1/intents?limit=2&cursor=" + c, token: O, schema: "valid", want: 200})
	}
	get(call{path: "/api/v1/intents?status=bogus", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/intents?limit=0", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/intents?limit=501", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/intents?cursor=abc", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/intents?sort=asc", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/intents", token: scopedOperatorSecret, schema: "valid", want: 403})
	get(call{path: "/api/v1/intents?resource=scoped-x", token: scopedOperatorSecret, schema: "valid", want: 200})
	id := strconv.FormatInt(emailID, 10)
	get(call{path: "/api/v1/intents/" + id, token: O, schema: "valid", want: 200})
	get(call{path: "/api/v1/intents/" + id + "?wait=10ms", token: O, schema: "valid", want: 200})
	get(call{path: "/api/v1/intents/" + id + "?wait=61s", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/intents/" + id + "?since=1", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/intents/abc", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/intents/0", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/intents/999999999", token: O, schema: "valid", want: 404})
	get(call{path: "/api/v1/intents/" + id, token: scopedOperatorSecret, schema: "valid", want: 403})
	get(call{path: "/api/v1/resources/walk-b", token: O, schema: "valid", want: 200})
	get(call{path: "/api/v1/resources/walk-a", token: O, schema: "valid", want: 200})
	get(call{path: "/api/v1/resources/nowhere", token: O, schema: "valid", want: 404})
	get(call{path: "/api/v1/resources/" + strings.Repeat("r", 201), token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/resources/walk-b", token: scopedOperatorSecret, schema: "valid", want: 403})
	get(call{path: "/api/v1/resources/walk-a/epochs", token: O, schema: "valid", want: 200})
	get(call{path: "/api/v1/resources/walk-b/epochs?limit=1", token: O, schema: "valid", want: 200})
	get(call{path: "/api/v1/resources/walk-b/epochs?limit=1001", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/resources/walk-b/epochs?until=1", token: O, schema: "invalid", want: 400})
	get(call{path: "/api/v1/resources/nowhere/epochs", token: O, schema: "valid", want: 404})

	// Actions.
	seed := func(op string, status outbox.Status, effect outbox.Effect) string {
		t.Helper()
		r := post(call{path: "/api/v1/intents", token: W, body: enq(op, "email", email), schema: "valid", want: 201})
		iid := num(r.obj["intent_id"])
		e.setStatus(iid, status, "550 no")
		e.setEffect(iid, effect, nil)
		return strconv.FormatInt(iid, 10)
	}
	failed, unknown, possible, pending := seed("a1", outbox.StatusFailed, outbox.EffectNone), seed("a2", outbox.StatusUnknown, outbox.EffectNone),
		seed("a3", outbox.StatusUnknown, outbox.EffectPossible), seed("a4", outbox.StatusPending, outbox.EffectNone)
	post(call{path: "/api/v1/intents/" + failed + "/retry", token: O, body: `{"note":"try again"}`, schema: "valid", want: 200})
	post(call{path: "/api/v1/intents/" + failed + "/retry", token: O, schema: "valid", want: 409, wantCode: "invalid_state"})
	r = post(call{path: "/api/v1/intents/" + possible + "/retry", token: O, schema: "valid", want: 409, wantCode: "invalid_state"})
	if r.errField("field") != "effect" {
		t.Errorf("retry of a possible effect: %s, want field effect", r.raw)
	}
	post(call{path: "/api/v1/intents/" + possible + "/cancel", token: O, body: `{"note":"x"}`, schema: "valid", want: 409, wantCode: "invalid_state"})
	post(call{path: "/api/v1/intents/" + possible + "/retry", token: O, body: `{"force":true,"note":"not in the mailbox"}`, schema: "valid", want: 200})
	post(call{path: "/api/v1/intents/" + unknown + "/retry", token: O, body: `{"outcome":"failed"}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/intents/" + unknown + "/resolve", token: O, body: `{"note":"n"}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/intents/" + unknown + "/resolve", token: O, schema: "invalid", want: 400})
	post(call{path: "/api/v1/intents/" + unknown + "/resolve", token: O, body: `{"outcome":"succeeded","note":"found it"}`, schema: "valid", want: 200})
	post(call{path: "/api/v1/intents/" + unknown + "/resolve", token: O, body: `{"outcome":"failed"}`, schema: "valid", want: 409, wantCode: "invalid_state"})
	post(call{path: "/api/v1/intents/" + pending + "/cancel", token: O, body: `{"force":true}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/intents/" + pending + "/cancel", token: O, schema: "valid", want: 200})
	post(call{path: "/api/v1/intents/" + pending + "/cancel", token: O, schema: "valid", want: 409})
	post(call{path: "/api/v1/intents/999999999/cancel", token: O, schema: "valid", want: 404})
	post(call{path: "/api/v1/intents/999999999/retry", token: O, schema: "valid", want: 404})
	post(call{path: "/api/v1/intents/999999999/resolve", token: O, body: `{"outcome":"failed"}`, schema: "valid", want: 404})
	post(call{path: "/api/v1/intents/abc/retry", token: O, schema: "invalid", want: 400})
	post(call{path: "/api/v1/intents/" + failed + "/cancel", token: scopedOperatorSecret, schema: "valid", want: 403})
	post(call{base: open, path: "/api/v1/intents/" + failed + "/cancel", noCtype: true, schema: "valid", want: 400,
		beyond: "a POST without Authorization needs Content-Type: application/json even without a body (no CSRF)"})
	post(call{path: "/api/v1/intents/bulk", token: O, body: `{"action":"retry","status":"failed","kind":"email","resource_prefix":"walk-","since":"1h","dry_run":true}`,
		schema: "valid", want: 200})
	post(call{path: "/api/v1/intents/bulk", token: O, body: `{"action":"cancel","status":"pending","note":"bulk"}`, schema: "valid", want: 200})
	post(call{path: "/api/v1/intents/bulk", token: O, body: `{"action":"retry","status":"pending"}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/intents/bulk", token: O, body: `{"action":"resolve","status":"unknown"}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/intents/bulk", token: O, body: `{"action":"cancel","status":"failed","force":true}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/intents/bulk", token: O, body: `{"action":"retry"}`, schema: "invalid", want: 400})
	post(call{path: "/api/v1/intents/bulk", token: scopedOperatorSecret, body: `{"action":"retry","status":"failed","dry_run":true}`, schema: "valid", want: 403})

	// A grant that cannot lock the control row: 503 busy.
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Rolled back on every way out: an open transaction would hold its
	// connection, and the pool's close at the test's end would wait.
	defer func() { _ = tx.Rollback(context.Background()) }()
	var in outbox.Intent
	if err := json.Unmarshal([]byte(enq("paused", "email", email)), &in); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ob.EnqueueTx(ctx, tx, in); err != nil {
		t.Fatal(err)
	}
	post(call{path: "/api/v1/leases", token: W, body: `{"resource":"walk-b","holder":"h9","ttl_ms":1000}`, schema: "valid", want: 503, wantCode: "busy"})
	// An enqueue of that resource too.
	post(call{path: "/api/v1/intents", token: W, body: enq("behind-the-lock", "email", email), schema: "valid", want: 503, wantCode: "busy"})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Paths and methods the API does not have.
	get(call{path: "/api/v1/nope", token: O, want: 404, wantCode: "not_found"})
	w.do(call{base: main, method: "DELETE", path: "/api/v1/intents", token: O, want: 405, wantCode: "method_not_allowed"})

	// NATS gone: not ready.
	ns.Shutdown()
	deadline := time.Now().Add(10 * time.Second)
	for nc.Status() == nats.CONNECTED && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	get(call{path: "/readyz", want: 503})

	// Coverage: every operation answered, with a success among its answers.
	w.mu.Lock()
	defer w.mu.Unlock()
	documented, unseen := 0, []string{}
	for _, k := range opKeys {
		op := sp.ops[k]
		ok := false
		for code := range w.seen[k] {
			ok = ok || code < 300
		}
		if !ok {
			t.Errorf("%s: the walk never had it succeed (answers %v)", k, w.seen[k])
		}
		for status := range op.responses {
			documented++
			if c, _ := strconv.Atoi(status); w.seen[k][c] == 0 {
				unseen = append(unseen, k+" "+status)
			}
		}
	}
	sort.Strings(unseen)
	t.Logf("%d requests on %d operations; %d documented answers, %d not produced by the walk: %v", w.n, len(opKeys), documented, len(unseen), unseen)
	if w.n == 0 || len(w.seen) == 0 {
		t.Fatal("no request walked")
	}
}

// minimalBody is a request body each operation accepts, for the requests
// that only look for the answers every route gives (401, 503…).
var minimalBody = map[string]string{
	"POST /api/v1/intents":              emailIntent("r", 1, "op"),
	"POST /api/v1/leases":               `{"resource":"r","holder":"h","ttl_ms":1000}`,
	"POST /api/v1/leases/renew":         `{"resource":"r","holder":"h","epoch":1,"ttl_ms":1000}`,
	"POST /api/v1/leases/release":       `{"resource":"r","holder":"h","epoch":1}`,
	"POST /api/v1/epochs":               `{"resource":"r","epoch":2}`,
	"POST /api/v1/intents/bulk":         `{"action":"retry","status":"failed","dry_run":true}`,
	"POST /api/v1/intents/{id}/resolve": `{"outcome":"failed"}`,
	"POST /api/v1/intents/{id}/retry":   `{}`,
	"POST /api/v1/intents/{id}/cancel":  `{}`,
}

// serveURL runs s on a loopback listener until the test ends; it returns
// the base URL.
func serveURL(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background(), ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return "http://" + ln.Addr().String()
}

// unreachablePool is a pool whose server refuses connections.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@" + closedPort(t) + "/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
