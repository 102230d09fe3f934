package admin

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/jsonnames"
	"github.com/fencegate/fencegate/operator"
)

// apiError is an error answer: its code gives the status (internal/errmap,
// the table the CLI's exit codes come from too), and the body is
// {"error":{"code","message","field"?, extra…}}; RetryAfter, when
// positive, is sent as the Retry-After header (seconds).
type apiError = errmap.Error

func badRequest(field, format string, args ...any) *apiError {
	return errmap.Invalid(field, fmt.Sprintf(format, args...))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.Code == errmap.Unauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="fencegate"`)
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	writeJSON(w, e.Status(), map[string]any{"error": e.Body()})
}

func oneLine(s string) string { return errmap.OneLine(s) }

// ErrInvalid is matched (errors.Is) by an *InputError. It is
// fenceerr.ErrInvalid, shared with lease, outbox and idempotency.
var ErrInvalid = fenceerr.ErrInvalid

// InputError names the request field that is wrong. Nothing was stored. It
// is fenceerr.InvalidError, the one invalid-input type of the module.
type InputError = fenceerr.InvalidError

func inputErr(field, format string, args ...any) error {
	return &InputError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// toAPIError maps an error of the libraries to its HTTP answer through
// errmap.Map, the CLI's mapping too, so the codes and fields are the same.
func toAPIError(err error) *apiError {
	ae := errmap.Map(err)
	var (
		inv *InputError
		ise *operator.InvalidStateError
	)
	switch {
	case ae.Code == errmap.InvalidInput && ae.Field == "ttl" && errors.As(err, &inv):
		// The issuer's ttl is the API's ttl_ms.
		return badRequest("ttl_ms", "ttl_ms: %s", inv.Message)
	case ae.Code == errmap.Internal && errors.As(err, &ise):
		// The admin package's own error: the CLI's operator actions are bulk
		// ones, which count a refused intent as skipped.
		extra := map[string]any{"intent_id": ise.IntentID, "action": ise.Action, "status": ise.Status, "allowed": ise.Allowed}
		if ise.InFlight {
			extra["in_flight"] = true
		}
		e := &apiError{Code: errmap.InvalidState, Message: err.Error(), Extra: extra}
		if ise.Effect != "" {
			// The status allows the action; what refuses it is the effect.
			e.Field = "effect"
			extra["effect"] = ise.Effect
		}
		return e
	case ae.Code == errmap.Unavailable && errmap.DatabaseUnavailable(err):
		return &apiError{Code: ae.Code, Message: "database unavailable: " + ae.Message}
	}
	return ae
}

// handlerFunc is an API endpoint: it returns the status and body of a
// success, or an error.
type handlerFunc func(r *http.Request, p principal) (int, any, error)

// authorize returns who makes the request, or the 401/403 answer.
func (s *Server) authorize(r *http.Request, role Role) (principal, *apiError) {
	if len(s.cfg.Tokens) == 0 {
		// Unauthenticated mode; Listen only binds loopback.
		return principal{name: anonymous, role: role, scope: Scope{Epochs: true}}, nil
	}
	tok, ok := bearer(r)
	if !ok {
		return principal{}, errmap.New(errmap.Unauthorized, "missing bearer token (Authorization: Bearer …)")
	}
	p, ok := s.auth.lookup(tok)
	if !ok {
		s.authFailed(r, "unknown token")
		return principal{}, errmap.New(errmap.Unauthorized, "unknown token")
	}
	if p.role != role {
		return principal{}, errmap.New(errmap.Forbidden,
			fmt.Sprintf("token %q has role %s; this endpoint needs %s", p.name, p.role, role))
	}
	return p, nil
}

// forbidden is a 403 naming what the token's scope refused.
func forbidden(field, format string, args ...any) error {
	e := errmap.New(errmap.Forbidden, fmt.Sprintf(format, args...))
	e.Field = field
	return e
}

// resource checks that p's scope covers resource: nothing outside it is
// read, granted, advanced or stored.
func (p principal) resource(resource string) error {
	if p.scope.Resource(resource) {
		return nil
	}
	return forbidden("resource", "token %q may not act on resource %q (its resources: %s)", p.name, resource, strings.Join(p.scope.Resources, ", "))
}

// intentResource is resource for an intent asked for by id: the refusal
// does not name the intent's resource, which the caller did not give (a
// scoped operator walking ids would learn which resources have intents).
func (p principal) intentResource(resource string) error {
	if p.scope.Resource(resource) {
		return nil
	}
	return forbidden("resource", "token %q may not act on this intent: its resource is outside the token's (%s)", p.name, strings.Join(p.scope.Resources, ", "))
}

// kind checks that p's scope covers kind.
func (p principal) kind(kind string) error {
	if p.scope.Kind(kind) {
		return nil
	}
	return forbidden("kind", "token %q may not enqueue kind %q (its kinds: %s)", p.name, kind, strings.Join(p.scope.Kinds, ", "))
}

// require wraps a plain handler with the role check.
func (s *Server) require(role Role, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.limited(w, r) {
			return
		}
		if _, e := s.authorize(r, role); e != nil {
			writeError(w, e)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// api wraps an endpoint with the role check, the body limit and error
// mapping.
func (s *Server) api(role Role, h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.limited(w, r) {
			return
		}
		p, e := s.authorize(r, role)
		if e != nil {
			writeError(w, e)
			return
		}
		if err := checkNotCrossSite(r); err != nil {
			writeError(w, toAPIError(err))
			return
		}
		// A query parameter given twice: which one counts is not guessed.
		for name, vs := range r.URL.Query() {
			if len(vs) > 1 {
				writeError(w, toAPIError(badRequest(name, "is given %d times; give it once", len(vs))))
				return
			}
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		status, body, err := h(r, p)
		if err != nil {
			ae := toAPIError(err)
			if ae.Status() >= 500 {
				s.cfg.Logger.Error("admin: request failed", "method", r.Method, "path", r.URL.Path, "status", ae.Status(), "err", err)
			}
			writeError(w, ae)
			return
		}
		writeJSON(w, status, body)
	})
}

// checkNotCrossSite refuses a state-changing request that a web page of
// another site could have sent: one without an Authorization header and
// without Content-Type: application/json, whatever its body (an empty form
// POST included). A browser sends neither cross-site without a CORS
// preflight, which this server never grants; so a page elsewhere cannot
// cancel or retry intents of a no-token (loopback) server.
func checkNotCrossSite(r *http.Request) error {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	if r.Header.Get("Authorization") != "" {
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == "application/json" {
		return nil
	}
	return badRequest("content_type", "a state-changing request needs Content-Type: application/json (or an Authorization header), whatever its body; got %q", ct)
}

// decodeBody decodes the JSON request body into dst strictly: the content
// type must be JSON, unknown fields, trailing data and bodies over the limit
// are errors naming the field ("body" when no field applies). With
// optional, an empty body leaves dst as is.
func decodeBody(r *http.Request, dst any, optional bool) error {
	if r.ContentLength == 0 {
		if optional {
			return nil
		}
		return badRequest("body", "request body is empty; a JSON object is required")
	}
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return badRequest("content_type", "Content-Type must be application/json, got %q", ct)
	}
	dec := json.NewDecoder(r.Body)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return decodeError(err, optional)
	}
	// Exactly one JSON value: anything after it but whitespace is refused,
	// so a body is never half-understood.
	if err := dec.Decode(&json.RawMessage{}); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return decodeError(err, optional)
		}
		return badRequest("body", "unexpected data after the JSON object")
	}
	// One object, each name once at every depth: a body that a proxy or an
	// audit log could read otherwise than the server (null as {}, the
	// first of two "resource"s where encoding/json takes the last) is
	// refused.
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return badRequest("body", "the body must be a JSON object")
	}
	if path, ok := repeatedName(raw); ok {
		return badRequest(path, "is given twice in one JSON object; give each name once")
	}
	// encoding/json matches keys case-insensitively ("Epoch" fills epoch);
	// a strict API takes only the exact names, so check them first.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err == nil {
		allowed := jsonFields(dst)
		for k := range keys {
			if !allowed[k] {
				field := k
				if field == "" {
					field = "body" // an empty key: no name to point at
				}
				return badRequest(field, "unknown field %q", k)
			}
		}
	}
	strict := json.NewDecoder(bytes.NewReader(raw))
	strict.DisallowUnknownFields()
	if err := strict.Decode(dst); err != nil {
		return decodeError(err, optional)
	}
	return nil
}

// repeatedName finds a name given twice in one object of the JSON value
// raw (valid JSON), at any depth, and returns its path as fields are named
// ("resource", "payload.to", "payload.to[1]" for an element's).
func repeatedName(raw json.RawMessage) (string, bool) {
	p, err := jsonnames.Check(raw, nil)
	if p == nil || err != nil {
		return "", false
	}
	return cmp.Or(p.Path, "body"), true
}

// jsonFields returns the JSON names of the fields of the struct dst points
// to, embedded structs included.
func jsonFields(dst any) map[string]bool {
	out := map[string]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for f := range t.Fields() {
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := strings.Cut(tag, ",")
			// An embedded struct's fields are promoted, as encoding/json
			// does, also when its type is unexported (resourceField).
			if f.Anonymous && name == "" {
				walk(f.Type)
				continue
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			out[name] = true
		}
	}
	walk(reflect.TypeOf(dst))
	return out
}

func decodeError(err error, optional bool) error {
	var (
		mbe   *http.MaxBytesError
		syn   *json.SyntaxError
		typ   *json.UnmarshalTypeError
		inval *json.InvalidUnmarshalError
	)
	switch {
	case errors.As(err, &mbe):
		return &apiError{Code: errmap.BodyTooLarge, Field: "body",
			Message: fmt.Sprintf("request body is over the limit of %d bytes", mbe.Limit)}
	case errors.Is(err, io.EOF):
		if optional {
			return nil
		}
		return badRequest("body", "request body is empty; a JSON object is required")
	case errors.As(err, &syn):
		return badRequest("body", "malformed JSON at byte %d: %s", syn.Offset, syn.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("body", "malformed JSON: unexpected end of body")
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
			return badRequest(field, "the body must be a JSON object, got %s", typ.Value)
		}
		return badRequest(field, "%s must be %s, got %s", field, jsonTypeName(typ.Type.Kind().String()), typ.Value)
	case errors.As(err, &inval):
		return err
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		field := strings.Trim(name, `"`)
		msg := fmt.Sprintf("unknown field %q", field)
		if field == "" {
			field = "body" // an empty key: no name to point at
		}
		return badRequest(field, "%s", msg)
	}
	return badRequest("body", "malformed JSON: %s", err.Error())
}

func jsonTypeName(kind string) string {
	switch kind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice":
		return "an array"
	}
	return "an object"
}
