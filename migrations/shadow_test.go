package migrations_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/migrations"
	"github.com/fencegate/fencegate/policy"
)

// pinnedPath is the search_path of every function of fencegate's: the
// catalog alone (pg_temp last, where it is never searched for functions
// or operators and cannot stand in for a table), so that no object of any
// other schema can be found by name inside them.
const pinnedPath = "search_path=pg_catalog, pg_temp"

// codeOf returns a function's source without its comments and string
// literals, quoted identifiers unquoted, but keeping the text of the
// literals that name a relation (nextval('…'), '…'::regclass): what the
// server resolves as names.
func codeOf(src string) string {
	var b strings.Builder
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case strings.HasPrefix(src[i:], "--"):
			for i < len(src) && src[i] != '\n' {
				i++
			}
			b.WriteByte(' ')
		case strings.HasPrefix(src[i:], "/*"):
			depth := 0
			for i < len(src) {
				if strings.HasPrefix(src[i:], "/*") {
					depth++
					i += 2
				} else if strings.HasPrefix(src[i:], "*/") {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
			b.WriteByte(' ')
		case c == '\'':
			// An E'' string escapes with backslashes; a standard one only
			// doubles its quotes.
			escaped := i > 0 && (src[i-1] == 'E' || src[i-1] == 'e') && (i < 2 || !isIdentByte(src[i-2]))
			var lit strings.Builder
			i++
			for i < len(src) {
				if escaped && src[i] == '\\' && i+1 < len(src) {
					lit.WriteByte(src[i+1])
					i += 2
					continue
				}
				if src[i] == '\'' {
					if i+1 < len(src) && src[i+1] == '\'' {
						lit.WriteByte('\'')
						i += 2
						continue
					}
					i++
					break
				}
				lit.WriteByte(src[i])
				i++
			}
			if relationLiteral(b.String(), src[i:]) {
				b.WriteString(" " + lit.String() + " ")
			} else {
				b.WriteString(" '' ")
			}
		case c == '"':
			i++
			for i < len(src) && src[i] != '"' {
				b.WriteByte(src[i])
				i++
			}
			i++
		case c == '$' && (i == 0 || !isIdentByte(src[i-1])):
			if m := dollarTagRE.FindString(src[i:]); m != "" {
				end := strings.Index(src[i+len(m):], m)
				if end < 0 {
					i = len(src)
				} else {
					i += len(m) + end + len(m)
				}
				b.WriteString(" '' ")
				continue
			}
			b.WriteByte(c)
			i++
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

var (
	dollarTagRE    = regexp.MustCompile(`^\$([A-Za-z_][A-Za-z_0-9]*)?\$`)
	relationCallRE = regexp.MustCompile(`(?i)\b(nextval|currval|setval|to_regclass|pg_get_serial_sequence)\s*\(\s*[Ee]?$`)
	regclassCastRE = regexp.MustCompile(`(?i)^\s*::\s*(pg_catalog\s*\.\s*)?regclass\b`)
	identRE        = regexp.MustCompile(`[A-Za-z_][A-Za-z_0-9$]*`)
)

// relationLiteral reports whether the string literal between before and
// after names a relation the server looks up.
func relationLiteral(before, after string) bool {
	return relationCallRE.MatchString(before) || regclassCastRE.MatchString(after)
}

func isIdentByte(c byte) bool {
	return c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// unqualifiedNames lists the names of fencegate's objects that code names
// without schema ("intents", "fencegate_invalid(") or with another schema,
// and counts the qualified ones. A name followed by "." is a qualifier
// (a table's alias or name in its own statement, "intents.intent_id", or
// a function's label for its parameters, "enqueue.resource"), never
// looked up in a schema.
func unqualifiedNames(code, schema string) (bad []string, qualified int) {
	objects := map[string]bool{}
	for _, o := range pgschema.Objects {
		objects[o] = true
	}
	for _, loc := range identRE.FindAllStringIndex(code, -1) {
		name := strings.ToLower(code[loc[0]:loc[1]])
		if loc[0] > 0 && isIdentByte(code[loc[0]-1]) || !objects[name] {
			continue
		}
		before := strings.TrimRight(code[:loc[0]], " \t\r\n")
		after := strings.TrimLeft(code[loc[1]:], " \t\r\n")
		if strings.HasSuffix(before, ".") {
			q := identRE.FindAllString(strings.TrimRight(strings.TrimSuffix(before, "."), " \t\r\n"), -1)
			if len(q) > 0 && strings.ToLower(q[len(q)-1]) == schema {
				qualified++
				continue
			}
			bad = append(bad, code[loc[0]:loc[1]]+" (named with another schema)")
			continue
		}
		if strings.HasPrefix(after, ".") {
			continue
		}
		bad = append(bad, code[loc[0]:loc[1]])
	}
	return bad, qualified
}

// The scanner finds what it must: names unqualified, qualified, in the
// literals the server resolves, and not in comments nor other literals.
func TestUnqualifiedNamesScanner(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		src       string
		bad       []string
		qualified int
	}{
		{`LOCK intents IN SHARE MODE; SELECT i.x`, []string{"intents"}, 0},
		{`SELECT * FROM fg.intents i`, nil, 1},
		{`SELECT * FROM other.intents`, []string{"intents (named with another schema)"}, 0},
		{`PERFORM fencegate_invalid('a', 'b')`, []string{"fencegate_invalid"}, 0},
		{`PERFORM fg . fencegate_invalid('intents', 'resources')`, nil, 1},
		{`a fg.epoch_authority%ROWTYPE; b epoch_authority%ROWTYPE;`, []string{"epoch_authority"}, 1},
		{`-- LOCK intents` + "\n" + `/* resources /* nested */ deployment */ x`, nil, 0},
		{`SELECT nextval('intents_intent_id_seq'), nextval('fg.intents_intent_id_seq'), 'resources'::regclass`, []string{"intents_intent_id_seq", "resources"}, 1},
		{`SELECT "intents".x FROM "resources"`, []string{"resources"}, 0},
		{`RETURNING intents.intent_id; x := enqueue.resource; y := E'it\'s intents'`, nil, 0},
		{`x := $q$ LOCK intents $q$ || $1`, nil, 0},
	} {
		bad, q := unqualifiedNames(codeOf(c.src), "fg")
		if !slices.Equal(bad, c.bad) || q != c.qualified {
			t.Errorf("%q: unqualified %q, %d qualified; want %q, %d", c.src, bad, q, c.bad, c.qualified)
		}
	}
}

// Every function of fencegate's names each of fencegate's objects with
// its schema, and has its search_path pinned to the catalog alone: no
// name in it can be resolved in any other schema, so no role that can
// create in fencegate's schema, or in public, can put a function or
// operator of its own in the way of a built-in one (an exact match beats
// a polymorphic built-in, whatever the search_path order) and have it run
// with the owner's rights.
func TestFunctionsQualified(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	rows, err := pool.Query(ctx, `
		SELECT p.oid::regprocedure::text, p.prosrc, coalesce(p.proconfig, '{}')
		FROM pg_proc p WHERE p.pronamespace = $1::regnamespace AND p.proname = ANY ($2) ORDER BY 1`,
		testdb.Schema(), pgschema.Objects)
	if err != nil {
		t.Fatal(err)
	}
	type fn struct {
		sig, src string
		config   []string
	}
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn, error) {
		var f fn
		return f, r.Scan(&f.sig, &f.src, &f.config)
	})
	if err != nil {
		t.Fatal(err)
	}
	total, unpinned := 0, 0
	for _, f := range fns {
		bad, q := unqualifiedNames(codeOf(f.src), testdb.Schema())
		total += q
		if len(bad) > 0 {
			t.Errorf("function %s names fencegate's objects without schema %s: %q", f.sig, testdb.Schema(), bad)
		}
		var paths []string
		for _, c := range f.config {
			if strings.HasPrefix(c, "search_path=") {
				paths = append(paths, c)
			}
		}
		if !slices.Equal(paths, []string{pinnedPath}) {
			unpinned++
			t.Errorf("function %s has search_path settings %q; want exactly %q", f.sig, paths, pinnedPath)
		}
	}
	t.Logf("%d functions of schema %s: %d qualified names of fencegate's objects, %d unpinned", len(fns), testdb.Schema(), total, unpinned)
	if len(fns) < 20 || total == 0 {
		t.Fatalf("%d functions, %d qualified names checked: the check saw nothing", len(fns), total)
	}
}

// shadow is a function, operator or aggregate a hostile role creates to
// be picked instead of a built-in one: where the built-in is polymorphic
// or variadic "any" (to_json, format, jsonb_build_object, array_length,
// ||), a concrete signature matching the call's argument types wins
// PostgreSQL's function resolution whatever the search_path order. Each
// records current_user when called, then returns the built-in's result,
// so the call it sits in goes on as it would have. A call on an error
// path is rolled back with the row it recorded, so each shadow also takes
// a value of a sequence of its own: nextval is never undone.
type shadow struct {
	kind string // function, operator or aggregate
	name string
	args []string
	ret  string
	// call is the built-in's result, of $1, $2, …
	call string
}

func shadows() []shadow {
	var s []shadow
	fn := func(name, ret, call string, args ...string) {
		s = append(s, shadow{"function", name, args, ret, call})
	}
	variadic := func(name string, args ...string) string {
		ps := make([]string, len(args))
		for i := range args {
			ps[i] = fmt.Sprintf("$%d", i+1)
		}
		return "pg_catalog." + name + "(" + strings.Join(ps, ", ") + ")"
	}
	fn("to_json", "json", "pg_catalog.to_json($1)", "text")
	fn("to_json", "json", "pg_catalog.to_json($1)", "bigint")
	fn("to_jsonb", "jsonb", "pg_catalog.to_jsonb($1)", "text")
	for _, args := range [][]string{
		{"text", "text"}, {"text", "json"}, {"text", "integer"}, {"text", "bigint"},
		{"text", "integer", "integer"}, {"text", "text", "integer"}, {"text", "text", "text"},
		{"text", "json", "bigint"}, {"text", "json", "bigint", "bigint"}, {"text", "json", "json", "bigint"},
		{"text", "json", "json", "bigint", "timestamptz"}, {"text", "json", "bigint", "bigint", "text"},
	} {
		fn("format", "text", variadic("format", args...), args...)
	}
	for _, args := range [][]string{
		{"text", "text", "text", "text"},
		{"text", "text", "text", "text", "text", "bigint", "text", "bigint"},
		{"text", "text", "text", "text", "text", "text", "text", "bigint"},
		{"text", "text", "text", "text", "text", "text", "text", "bigint", "text", "timestamptz"},
		{"text", "text", "text", "text", "text", "bigint", "text", "bigint", "text", "text"},
	} {
		fn("jsonb_build_object", "jsonb", variadic("jsonb_build_object", args...), args...)
	}
	fn("concat", "text", "pg_catalog.concat($1, $2)", "text", "text")
	fn("octet_length", "integer", "pg_catalog.octet_length($1)", "varchar")
	fn("octet_length", "integer", "pg_catalog.octet_length($1)", "text")
	fn("length", "integer", "pg_catalog.length($1)", "text")
	fn("left", "text", "pg_catalog.left($1, $2)", "text", "integer")
	fn("right", "text", "pg_catalog.right($1, $2)", "text", "integer")
	fn("lower", "text", "pg_catalog.lower($1)", "text")
	fn("md5", "text", "pg_catalog.md5($1)", "text")
	fn("substr", "text", "pg_catalog.substr($1, $2, $3)", "text", "integer", "integer")
	fn("string_to_array", "text[]", "pg_catalog.string_to_array($1, $2)", "text", "text")
	fn("array_length", "integer", "pg_catalog.array_length($1, $2)", "text[]", "integer")
	fn("cardinality", "integer", "pg_catalog.cardinality($1)", "text[]")
	fn("array_to_string", "text", "pg_catalog.array_to_string($1, $2)", "text[]", "text")
	fn("unnest", "SETOF text", "pg_catalog.unnest($1)", "text[]")
	fn("unnest", "SETOF bigint", "pg_catalog.unnest($1)", "bigint[]")
	fn("jsonb_typeof", "text", "pg_catalog.jsonb_typeof($1)", "jsonb")
	fn("jsonb_object_keys", "SETOF text", "pg_catalog.jsonb_object_keys($1)", "jsonb")
	fn("current_setting", "text", "pg_catalog.current_setting($1, $2)", "text", "boolean")
	fn("now", "timestamptz", "pg_catalog.now()")
	op := func(name, left, right, ret, call string) {
		s = append(s, shadow{"operator", name, []string{left, right}, ret, call})
	}
	op("||", "text[]", "text", "text[]", "pg_catalog.array_append($1, $2)")
	op("||", "text", "name", "text", "pg_catalog.textcat($1, $2::text)")
	op("||", "text", "text", "text", "pg_catalog.textcat($1, $2)")
	op("~", "text", "text", "boolean", "pg_catalog.textregexeq($1, $2)")
	op("!~", "text", "text", "boolean", "pg_catalog.textregexne($1, $2)")
	op("=", "text", "text", "boolean", "pg_catalog.texteq($1, $2)")
	op("->>", "jsonb", "text", "text", "pg_catalog.jsonb_object_field_text($1, $2)")
	s = append(s,
		shadow{"aggregate", "array_agg", []string{"text"}, "text[]", "pg_catalog.array_append($1, $2)"},
		shadow{"aggregate", "array_agg", []string{"bigint"}, "bigint[]", "pg_catalog.array_append($1, $2)"})
	return s
}

// probeValues are values of the shadows' argument types, to call each one
// by its qualified name.
var probeValues = map[string]string{
	"text": `'a'::text`, "varchar": `'a'::varchar`, "name": `'a'::name`, "json": `'1'::json`, "jsonb": `'{"a":"b"}'::jsonb`,
	"integer": `1`, "bigint": `1::bigint`, "boolean": `true`, "timestamptz": `now()`,
	"text[]": `'{a}'::text[]`, "bigint[]": `'{1}'::bigint[]`,
}

// create returns the statements creating sh in schema s, recording into
// table rec and sequence seq, its label, and a statement calling it by its
// qualified name.
func (sh shadow) create(s, rec, seq string, n int) (create []string, label, probe string) {
	label = fmt.Sprintf("%s %s.%s(%s)", sh.kind, s, sh.name, strings.Join(sh.args, ", "))
	record := fmt.Sprintf("SELECT pg_catalog.nextval(%s); INSERT INTO %s (who, what) VALUES (current_user, %s);",
		quoteLiteral(seq), rec, quoteLiteral(label))
	vals := make([]string, len(sh.args))
	for i, a := range sh.args {
		vals[i] = probeValues[a]
	}
	switch sh.kind {
	case "function":
		create = []string{fmt.Sprintf(`CREATE FUNCTION %s.%s(%s) RETURNS %s LANGUAGE sql AS $hostile$ %s SELECT %s $hostile$`,
			s, pgx.Identifier{sh.name}.Sanitize(), strings.Join(sh.args, ", "), sh.ret, record, sh.call)}
		probe = fmt.Sprintf("SELECT %s.%s(%s)", s, pgx.Identifier{sh.name}.Sanitize(), strings.Join(vals, ", "))
	case "operator":
		impl := fmt.Sprintf("hostile_op_%d", n)
		create = []string{
			fmt.Sprintf(`CREATE FUNCTION %s.%s(%s) RETURNS %s LANGUAGE sql AS $hostile$ %s SELECT %s $hostile$`,
				s, impl, strings.Join(sh.args, ", "), sh.ret, record, sh.call),
			fmt.Sprintf(`CREATE OPERATOR %s.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s.%s)`,
				s, sh.name, sh.args[0], sh.args[1], s, impl),
		}
		probe = fmt.Sprintf("SELECT %s OPERATOR(%s.%s) %s", vals[0], s, sh.name, vals[1])
	case "aggregate":
		step := fmt.Sprintf("hostile_step_%d", n)
		create = []string{
			fmt.Sprintf(`CREATE FUNCTION %s.%s(%s, %s) RETURNS %s LANGUAGE sql AS $hostile$ %s SELECT %s $hostile$`,
				s, step, sh.ret, sh.args[0], sh.ret, record, sh.call),
			fmt.Sprintf(`CREATE AGGREGATE %s.%s(%s) (SFUNC = %s.%s, STYPE = %s)`, s, sh.name, sh.args[0], s, step, sh.ret),
		}
		probe = fmt.Sprintf("SELECT %s.%s(v) FROM (VALUES (%s)) t(v)", s, sh.name, vals[0])
	}
	create = append([]string{fmt.Sprintf("CREATE SEQUENCE %s; GRANT USAGE ON SEQUENCE %s TO PUBLIC", seq, seq)}, create...)
	return create, label, probe
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// hostileCall is one call of the SQL interface by the hostile role, and
// the SQLSTATE it must end with ("" for success): each call must reach the
// path it is meant for, or it proves nothing.
type hostileCall struct {
	name, sql string
	args      []any
	code      string
}

// hostileCalls are calls of enqueue, acquire, renew and release on
// success and on every refusal the interface has, for resource r whose
// lease, of holder H at epoch e, was just granted.
func hostileCalls(e int64) []hostileCall {
	const enq = `SELECT outcome FROM fencegate.enqueue(resource => $1, epoch => $2, operation_id => $3, kind => $4, payload => $5::jsonb, key => $6, fence => $7)`
	var calls []hostileCall
	n := 0
	add := func(name, code, resource string, epoch int64, kind, payload string, key, fence *string) {
		n++
		calls = append(calls, hostileCall{"enqueue: " + name, enq,
			[]any{resource, epoch, fmt.Sprintf("op-%d", n), kind, payload, key, fence}, code})
	}
	ok := func(name, kind, payload string) { add(name, "", "r", e, kind, payload, nil, nil) }
	bad := func(name, kind, payload string) { add(name, "ZF004", "r", e, kind, payload, nil, nil) }
	ok("email", "email", mail)
	ok("email to and cc lists", "email", `{"to":["alice@example.com","Bob Smith <bob@example.com>"],"cc":["carol@example.com"],"from":"r@example.com","subject":"s","html":"<p>h</p>"}`)
	ok("file", "file", `{"target":"out/a.txt","content":"x"}`)
	ok("file, a dotfile", "file", `{"target":"out/.hidden","content_base64":"eA=="}`)
	ok("s3", "s3", `{"bucket":"my-bucket","key":"k/a.txt","content":"x","content_type":"text/plain","metadata":{"a-b":"v"}}`)
	ok("webhook", "webhook", `{"url":"https://example.com/h?x=1","method":"PUT","headers":{"X-A":"b"},"body":{"x":1},"lookup_url":"https://example.com/l"}`)
	ok("webhook, base64 body", "webhook", `{"url":"https://example.com/h","body_base64":"eA==","content_type":"text/plain"}`)
	long := strings.Repeat("x", 201)
	add("empty resource", "ZF004", "", e, "email", mail, nil, nil)
	add("long resource", "ZF004", long, e, "email", mail, nil, nil)
	add("epoch 0", "ZF004", "r", 0, "email", mail, nil, nil)
	add("epoch above 2^53", "ZF004", "r", 1<<53+1, "email", mail, nil, nil)
	add("long key", "ZF004", "r", e, "email", mail, ptr(strings.Repeat("k", 256)), nil)
	add("bad fence", "ZF004", "r", e, "email", mail, nil, ptr("later"))
	add("stale epoch", "ZF002", "r", e+1, "email", mail, nil, nil)
	add("no epoch ever issued", "ZF002", "never", 1, "email", mail, nil, nil)
	bad("no kind", "", mail)
	bad("unknown kind", "sms", mail)
	bad("payload not an object", "email", `[1]`)
	bad("payload too large", "email", `{"x":"`+strings.Repeat("y", 262144)+`"}`)
	for name, p := range map[string]string{
		"no to":              `{"from":"r@example.com","subject":"s","text":"t"}`,
		"to not a string":    `{"to":5,"from":"r@example.com","subject":"s","text":"t"}`,
		"bad address":        `{"to":["alice@example.com","not an address"],"from":"r@example.com","subject":"s","text":"t"}`,
		"cc not strings":     `{"to":"alice@example.com","cc":[1],"from":"r@example.com","subject":"s","text":"t"}`,
		"bad from":           `{"to":"alice@example.com","from":"r","subject":"s","text":"t"}`,
		"blank subject":      `{"to":"alice@example.com","from":"r@example.com","subject":" ","text":"t"}`,
		"two-line subject":   `{"to":"alice@example.com","from":"r@example.com","subject":"a\nb","text":"t"}`,
		"no text":            `{"to":"alice@example.com","from":"r@example.com","subject":"s"}`,
		"subject not string": `{"to":"alice@example.com","from":"r@example.com","subject":1,"text":"t"}`,
	} {
		bad("email, "+name, "email", p)
	}
	for name, p := range map[string]string{
		"absolute":     `{"target":"/a","content":"x"}`,
		"dot-dot":      `{"target":"a/../b","content":"x"}`,
		"empty seg":    `{"target":"a//b","content":"x"}`,
		"reserved":     `{"target":"a/.b.fencegate.c","content":"x"}`,
		"both content": `{"target":"a","content":"x","content_base64":"eA=="}`,
		"no content":   `{"target":"a"}`,
		"bad base64":   `{"target":"a","content_base64":"abc"}`,
		"no target":    `{"content":"x"}`,
	} {
		bad("file, "+name, "file", p)
	}
	for name, p := range map[string]string{
		"unknown field":       `{"bucket":"b-b","key":"k","content":"x","extra":1}`,
		"bad bucket":          `{"bucket":"B!","key":"k","content":"x"}`,
		"long key":            `{"bucket":"bbb","key":"` + strings.Repeat("k", 1100) + `","content":"x"}`,
		"metadata bad name":   `{"bucket":"bbb","key":"k","content":"x","metadata":{"Bad":"x"}}`,
		"metadata reserved":   `{"bucket":"bbb","key":"k","content":"x","metadata":{"fencegate-x":"y"}}`,
		"metadata two lines":  `{"bucket":"bbb","key":"k","content":"x","metadata":{"a":"x\ny"}}`,
		"metadata not string": `{"bucket":"bbb","key":"k","content":"x","metadata":{"a":1}}`,
		"metadata not object": `{"bucket":"bbb","key":"k","content":"x","metadata":"x"}`,
		"metadata too large":  `{"bucket":"bbb","key":"k","content":"x","metadata":{"a":"` + strings.Repeat("v", 1100) + `"}}`,
		"content type":        `{"bucket":"bbb","key":"k","content":"x","content_type":"a\nb"}`,
	} {
		bad("s3, "+name, "s3", p)
	}
	for name, p := range map[string]string{
		"unknown field":            `{"url":"https://example.com","extra":1}`,
		"bad url":                  `{"url":"ftp://example.com"}`,
		"long url":                 `{"url":"https://example.com/` + strings.Repeat("p", 2100) + `"}`,
		"no url":                   `{"method":"POST"}`,
		"bad method":               `{"url":"https://example.com","method":"GET"}`,
		"bad header name":          `{"url":"https://example.com","headers":{"bad header":"x"}}`,
		"gateway's header":         `{"url":"https://example.com","headers":{"Idempotency-Key":"x"}}`,
		"content-type header":      `{"url":"https://example.com","headers":{"Content-Type":"x"}}`,
		"framing header":           `{"url":"https://example.com","headers":{"Connection":"x"}}`,
		"two-line header":          `{"url":"https://example.com","headers":{"X-A":"a\nb"}}`,
		"headers not object":       `{"url":"https://example.com","headers":[1]}`,
		"body and body_base64":     `{"url":"https://example.com","body":{},"body_base64":"eA==","content_type":"a/b"}`,
		"bad body_base64":          `{"url":"https://example.com","body_base64":"abc","content_type":"a/b"}`,
		"body_base64, no type":     `{"url":"https://example.com","body_base64":"eA=="}`,
		"type, no body_base64":     `{"url":"https://example.com","content_type":"a/b"}`,
		"two-line content type":    `{"url":"https://example.com","body_base64":"eA==","content_type":"a\nb"}`,
		"bad lookup_url":           `{"url":"https://example.com","lookup_url":"https://user@example.com"}`,
		"method not a string":      `{"url":"https://example.com","method":1}`,
		"url with a bad character": `{"url":"https://exa mple.com"}`,
	} {
		bad("webhook, "+name, "webhook", p)
	}
	calls = append(calls, hostileCall{"enqueue: long default key", enq,
		[]any{strings.Repeat("r", 200), e, strings.Repeat("o", 60), "email", mail, nil, nil}, "ZF004"})
	// A duplicate (the first call's retry) and a conflict (its operation
	// id, other content).
	calls = append(calls,
		hostileCall{"enqueue: duplicate", enq, []any{"r", e, "op-1", "email", mail, nil, nil}, ""},
		hostileCall{"enqueue: conflict", enq, []any{"r", e, "op-1", "email", strings.Replace(mail, "ready", "changed", 1), nil, nil}, "ZF003"})
	for _, c := range []hostileCall{
		{"acquire: held by another", `SELECT epoch FROM fencegate.acquire($1, $2, $3::interval)`, []any{"r", "G", "1 minute"}, "ZF005"},
		{"acquire: bad ttl", `SELECT epoch FROM fencegate.acquire($1, $2, $3::interval)`, []any{"q", "G", "1 millisecond"}, "ZF004"},
		{"acquire: no holder", `SELECT epoch FROM fencegate.acquire($1, $2, $3::interval)`, []any{"q", "", "1 minute"}, "ZF004"},
		{"acquire: bad failover jump", `SELECT epoch FROM fencegate.acquire($1, $2, $3::interval, $4)`, []any{"q", "G", "1 minute", int64(-1)}, "ZF004"},
		{"renew", `SELECT fencegate.renew($1, $2, $3, $4::interval)`, []any{"r", "H", e, "1 minute"}, ""},
		{"renew: another holder", `SELECT fencegate.renew($1, $2, $3, $4::interval)`, []any{"r", "G", e, "1 minute"}, "ZF002"},
		{"renew: stale epoch", `SELECT fencegate.renew($1, $2, $3, $4::interval)`, []any{"r", "H", e + 1, "1 minute"}, "ZF002"},
		{"renew: never issued", `SELECT fencegate.renew($1, $2, $3, $4::interval)`, []any{"never", "H", int64(1), "1 minute"}, "ZF002"},
		{"renew: bad ttl", `SELECT fencegate.renew($1, $2, $3, $4::interval)`, []any{"r", "H", e, "25 hours"}, "ZF004"},
		{"renew: bad epoch", `SELECT fencegate.renew($1, $2, $3, $4::interval)`, []any{"r", "H", int64(0), "1 minute"}, "ZF004"},
		{"renew: long resource", `SELECT fencegate.renew($1, $2, $3, $4::interval)`, []any{long, "H", e, "1 minute"}, "ZF004"},
		{"release: another holder", `SELECT fencegate.release($1, $2, $3)`, []any{"r", "G", e}, "ZF002"},
		{"release: stale epoch", `SELECT fencegate.release($1, $2, $3)`, []any{"r", "H", e + 1}, "ZF002"},
		{"release: bad epoch", `SELECT fencegate.release($1, $2, $3)`, []any{"r", "H", int64(1<<53 + 1)}, "ZF004"},
		{"release", `SELECT fencegate.release($1, $2, $3)`, []any{"r", "H", e}, ""},
		{"release: again", `SELECT fencegate.release($1, $2, $3)`, []any{"r", "H", e}, ""},
		{"renew: released", `SELECT fencegate.renew($1, $2, $3, $4::interval)`, []any{"r", "H", e, "1 minute"}, "ZF002"},
		{"acquire: after release", `SELECT epoch FROM fencegate.acquire($1, $2, $3::interval)`, []any{"r", "G", "1 minute"}, ""},
		{"acquire: reacquire", `SELECT epoch FROM fencegate.acquire($1, $2, $3::interval)`, []any{"r", "G", "1 minute"}, ""},
		{"acquire: a new resource", `SELECT epoch FROM fencegate.acquire($1, $2, $3::interval)`, []any{"q", "G", "1 minute"}, ""},
		{"enqueue: stale after takeover", enq, []any{"r", e, "op-late", "email", mail, nil, nil}, "ZF002"},
	} {
		calls = append(calls, c)
	}
	return calls
}

// A role that may create objects in fencegate's schema and in public (an
// install into public on a PostgreSQL before 15, or into an application's
// schema), and is granted the SQL interface as docs/sql.md says, fills
// every schema it can reach with functions, operators and aggregates that
// would beat the built-ins the interface uses, then calls the interface on
// every path it has. None of them ever runs: the interface runs with its
// owner's rights, and would run them with those.
func TestHostileRoleCannotShadow(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		schema string
		from   int64 // upgraded from this version; 0: a fresh install
	}{
		{"schema " + testdb.Schema(), testdb.Schema(), 0},
		{"schema " + testdb.Schema() + " upgraded", testdb.Schema(), lastWithoutFunctionFiles},
		{"schema public", "public", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			hostileRoleCannotShadow(t, c.schema, c.from)
		})
	}
}

// hostileSetup is a database migrated into schema (fresh, or upgraded from
// versioned migration from), a pool on it, and a connection as a role of
// the cluster granted what docs/sql.md grants a worker, and CREATE where
// it should never have it: fencegate's schema and public. Everything is
// closed or dropped at the test's end.
func hostileSetup(t *testing.T, schema string, from int64) (pgschema.Schema, *pgxpool.Pool, string, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	s := pgschema.MustParse(schema)
	// The role is the cluster's, dropped after the database (made first,
	// its cleanup runs last).
	role, password := testdb.Role(t, nil, "hostile_"), testdb.RolePassword
	dbURL := testdb.NewEmptyURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if from > 0 {
		if err := migrations.UpVersioned(ctx, pool, schema, from); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, s.SQL(fmt.Sprintf(`
		GRANT USAGE, CREATE ON SCHEMA %[2]s TO %[1]s;
		GRANT USAGE, CREATE ON SCHEMA public TO %[1]s;
		GRANT EXECUTE ON FUNCTION fencegate.enqueue(text, bigint, text, text, jsonb, text, text) TO %[1]s;
		GRANT EXECUTE ON FUNCTION fencegate.acquire(text, text, interval, bigint),
		                          fencegate.renew(text, text, bigint, interval),
		                          fencegate.release(text, text, bigint) TO %[1]s;`, role, s.Name()))); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	hostile, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	// Closed before the pool (cleanups run last first).
	t.Cleanup(func() { _ = hostile.Close(context.Background()) })
	return s, pool, role, hostile
}

func hostileRoleCannotShadow(t *testing.T, schema string, from int64) {
	ctx := context.Background()
	s, pool, role, hostile := hostileSetup(t, schema, from)
	var superuser bool
	if err := pool.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&superuser); err != nil {
		t.Fatal(err)
	}
	const rec = "public.hostile_calls"
	if _, err := hostile.Exec(ctx, `CREATE TABLE `+rec+` (who text NOT NULL, what text NOT NULL);
		GRANT INSERT ON `+rec+` TO PUBLIC`); err != nil {
		t.Fatal(err)
	}
	// Every schema the role can create in, and its own temporary one.
	targets := slices.Compact([]string{s.Name(), "public", "pg_temp"})
	var probes, labels []string
	for _, target := range targets {
		for _, sh := range shadows() {
			n := len(probes)
			create, label, probe := sh.create(target, rec, fmt.Sprintf("public.hostile_fired_%d", n), n)
			for _, stmt := range create {
				if _, err := hostile.Exec(ctx, stmt); err != nil {
					t.Fatalf("as %s: %s: %v", role, stmt, err)
				}
			}
			probes, labels = append(probes, probe), append(labels, label)
		}
	}
	// fired lists the rows recorded, then the shadows whose sequence was
	// taken from (on a path rolled back, the row is gone).
	fired := func() []string {
		out := records(t, pool, rec)
		seqs := testdb.Strings(t, pool, `SELECT sequencename FROM pg_sequences
			WHERE schemaname = 'public' AND sequencename LIKE 'hostile\_fired\_%' AND last_value IS NOT NULL`)
		for _, name := range seqs {
			var i int
			if _, err := fmt.Sscanf(name, "hostile_fired_%d", &i); err != nil || i >= len(labels) {
				t.Fatalf("sequence %s: %v", name, err)
			}
			out = append(out, "(taken from its sequence): "+labels[i])
		}
		return out
	}

	// The interface, on every path: the lease first, for its epoch.
	var epoch int64
	if err := hostile.QueryRow(ctx, s.SQL(`SELECT epoch FROM fencegate.acquire('r', 'H', interval '1 minute')`)).Scan(&epoch); err != nil {
		t.Fatalf("as %s: acquire: %v", role, err)
	}
	calls, codes := 1, map[string]int{"ok": 1}
	for _, c := range hostileCalls(epoch) {
		calls++
		_, err := hostile.Exec(ctx, s.SQL(c.sql), c.args...)
		got := "ok"
		if err != nil {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) {
				t.Fatalf("as %s: %s: %v", role, c.name, err)
			}
			got = pe.Code
		}
		codes[got]++
		want := c.code
		if want == "" {
			want = "ok"
		}
		if got != want {
			t.Errorf("as %s: %s: %s (%v); want %s", role, c.name, got, err, want)
		}
	}

	ran := fired()
	var tally []string
	for _, k := range slices.Sorted(maps.Keys(codes)) {
		tally = append(tally, fmt.Sprintf("%s %d", k, codes[k]))
	}
	t.Logf("schema %s (migrated by a superuser: %t): %d calls of the interface by %s (%s); %d shadows in %q; %d records of them running",
		s.Name(), superuser, calls, role, strings.Join(tally, ", "), len(probes), targets, len(ran))
	if len(ran) > 0 {
		t.Errorf("the interface ran the hostile role's objects, with its owner's rights (%d records):\n  %s", len(ran), strings.Join(slices.Compact(ran), "\n  "))
	}
	if calls < 50 || len(probes) == 0 {
		t.Fatalf("%d calls, %d shadows: the check tried nothing", calls, len(probes))
	}

	// Each shadow records when it is called: called by name, every one of
	// them does (else the check above proves nothing).
	if _, err := pool.Exec(ctx, `TRUNCATE `+rec); err != nil {
		t.Fatal(err)
	}
	for _, p := range probes {
		if _, err := hostile.Exec(ctx, p); err != nil {
			t.Fatalf("as %s: %s: %v", role, p, err)
		}
	}
	recorded, taken := 0, 0
	for _, r := range slices.Compact(fired()) {
		switch {
		case strings.HasPrefix(r, role+": "):
			recorded++
		case strings.HasPrefix(r, "(taken from its sequence): "):
			taken++
		}
	}
	t.Logf("called by name, %d of the %d shadows recorded their call as %s, %d took from their sequence", recorded, len(probes), role, taken)
	if recorded != len(probes) || taken != len(probes) {
		t.Fatalf("%d and %d of %d shadows recorded their call: a shadow that cannot record proves nothing", recorded, taken, len(probes))
	}
}

// records are the rows of the hostile role's table rec, "who: what",
// sorted. Read with no operator or function the role could have shadowed
// in the reading session's public.
func records(t *testing.T, pool *pgxpool.Pool, rec string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT who, what FROM `+rec)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var who, what string
		if err := rows.Scan(&who, &what); err != nil {
			t.Fatal(err)
		}
		out = append(out, who+": "+what)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// The functions that named their schema with current_schema() (with the
// search_path pinned to it) read it now from a name of fencegate's,
// renamed with the schema: the derived namespace is the one derived before
// (system identifier / database [/ schema]), and the channels are the
// schema's.
func TestFunctionsKnowTheirSchema(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	s := testdb.PGSchema()
	var got, want string
	if err := pool.QueryRow(ctx, s.SQL(`
		SELECT fencegate.fencegate_derived_namespace(),
		       'd' || substr(md5(fencegate.fencegate_deployment_sysid() || '/' || current_database()
		           || CASE WHEN $1 IN ('fencegate', 'public') THEN '' ELSE '/' || $1 END), 1, 11)`), s.Name()).Scan(&got, &want); err != nil {
		t.Fatal(err)
	}
	t.Logf("schema %s: derived namespace %s", s.Name(), got)
	if got != want || want == "" {
		t.Fatalf("derived namespace %q; want %q (of the system identifier, the database and schema %s)", got, want, s.Name())
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, ch := range []string{s.IntentsChannel(), s.OutcomesChannel()} {
		if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
			t.Fatal(err)
		}
	}
	tag, err := pool.Exec(ctx, s.SQL(`
		INSERT INTO fencegate.resources (resource_id, epoch) VALUES ('r', 1);
		SELECT fencegate.fencegate_enqueue('r', 1, 'o', 'email', 'r/o', 'commit', '{}', true);
		UPDATE fencegate.intents SET status = 'succeeded'`))
	if err != nil {
		t.Fatalf("enqueue and settle (%v): %v", tag, err)
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := conn.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("notifications seen %v: %v", slices.Sorted(maps.Keys(seen)), err)
		}
		seen[n.Channel] = true
	}
	t.Logf("notified on %v", slices.Sorted(maps.Keys(seen)))
	if !seen[s.IntentsChannel()] || !seen[s.OutcomesChannel()] {
		t.Fatalf("notified on %v; want %s and %s", slices.Sorted(maps.Keys(seen)), s.IntentsChannel(), s.OutcomesChannel())
	}
}

// The SQL interface's functions run with the rights of the role that ran
// migrate (SECURITY DEFINER): migrate refuses to install them in a schema
// where another role could create a function or operator that name
// resolution inside them might pick, unless told to (AllowUnsafeSchema).
// Each case is refused naming the roles, and nothing is stored; the
// override installs; a schema of fencegate's own (created by migrate) and
// one the migrating role owns with no grant to others are accepted.
func TestUpRefusesSchemaOthersCanCreateIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hostile, app, group := testdb.Role(t, nil, "fg_hostile_"), testdb.Role(t, nil, "fg_app_"), testdb.Role(t, nil, "fg_group_")
	cases := []struct {
		name, schema string
		setup        []string
		want         []string // the roles named; nil: accepted
		// What the refusal says to undo: the roles CREATE was granted
		// to, and the owner when it is one of them.
		granted []string
		owner   string
	}{
		{"a role granted CREATE on public", "public",
			[]string{"GRANT CREATE ON SCHEMA public TO " + hostile}, []string{hostile}, []string{hostile}, ""},
		{"PUBLIC granted CREATE on public", "public",
			[]string{"GRANT CREATE ON SCHEMA public TO PUBLIC"}, []string{"PUBLIC"}, []string{"PUBLIC"}, ""},
		{"an application's schema, owned by another role", "appdata",
			[]string{"CREATE SCHEMA appdata AUTHORIZATION " + app}, []string{app}, []string{}, app},
		{"a schema of its own where a role was granted CREATE", "ours",
			[]string{"CREATE SCHEMA ours", "GRANT CREATE ON SCHEMA ours TO " + hostile}, []string{hostile}, []string{hostile}, ""},
		// A member of a group holding the grant creates through it: the
		// grant to revoke is the group's (the hint said to revoke it from
		// the member, which changed nothing).
		{"a schema of its own where a group was granted CREATE", "ours",
			[]string{"CREATE SCHEMA ours", "GRANT CREATE ON SCHEMA ours TO " + group, "GRANT " + group + " TO " + hostile},
			[]string{group, hostile}, []string{group}, ""},
		{"a schema of its own, USAGE granted only", "ours",
			[]string{"CREATE SCHEMA ours", "GRANT USAGE ON SCHEMA ours TO " + hostile}, nil, nil, ""},
		{"public, CREATE revoked from PUBLIC", "public",
			[]string{"REVOKE CREATE ON SCHEMA public FROM PUBLIC"}, nil, nil, ""},
	}
	checked := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool := emptyDatabase(t)
			for _, stmt := range c.setup {
				if _, err := pool.Exec(ctx, stmt); err != nil {
					t.Fatal(err)
				}
			}
			// Roles are the cluster's: each database drops what it granted
			// before the roles go.
			t.Cleanup(func() {
				_, _ = pool.Exec(context.Background(), "REVOKE "+group+" FROM "+hostile)
				for _, r := range []string{hostile, app, group} {
					_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+r)
				}
			})
			_, err := migrations.Up(ctx, pool, migrations.Config{Schema: c.schema})
			if c.want == nil {
				if err != nil {
					t.Fatalf("Up into %s: %v; want it accepted", c.schema, err)
				}
				checked++
				return
			}
			var unsafe *migrations.UnsafeSchemaError
			if !errors.As(err, &unsafe) {
				t.Fatalf("Up into %s = %v; want an *UnsafeSchemaError", c.schema, err)
			}
			if unsafe.Schema != c.schema || !slices.Equal(unsafe.Roles, c.want) {
				t.Fatalf("refusal = %+v; want schema %s, roles %v", unsafe, c.schema, c.want)
			}
			if !slices.Equal(unsafe.Granted, c.granted) || unsafe.Owner != c.owner {
				t.Fatalf("refusal = %+v; want it to say to revoke from %v, owner %q\n%s", unsafe, c.granted, c.owner, unsafe)
			}
			var tables int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace`, c.schema).Scan(&tables); err != nil {
				t.Fatal(err)
			}
			if tables != 0 {
				t.Fatalf("a refused Up left %d relations in %s", tables, c.schema)
			}
			// Told explicitly, it installs.
			if _, err := migrations.Up(ctx, pool, migrations.Config{Schema: c.schema, AllowUnsafeSchema: true}); err != nil {
				t.Fatalf("Up into %s with AllowUnsafeSchema: %v", c.schema, err)
			}
			if ok, err := migrations.Installed(ctx, pool, c.schema); err != nil || !ok {
				t.Fatalf("Installed(%s) after the override = %t, %v", c.schema, ok, err)
			}
			checked++
		})
	}
	if checked != len(cases) {
		t.Fatalf("%d of %d schema cases checked", checked, len(cases))
	}
	t.Logf("%d of %d schema cases checked", checked, len(cases))
}

// overloadTypes are the argument types a hostile overload of one of
// fencegate's own functions puts in one position. A call inside a body
// whose argument there is an untyped literal (NULL, '{}') goes to an
// overload taking text (PostgreSQL prefers the string category for an
// unknown literal); one whose argument needs an implicit cast (integer to
// bigint, name or varchar to text) goes to the overload taking its exact
// type. Naming the function with its schema does not prevent either: the
// overload is in that schema.
var overloadTypes = []string{"text", "varchar", "name", "integer", "bigint", "numeric", "jsonb", "json", "boolean", "interval", "timestamptz"}

// With --allow-unsafe-schema, a role that may create in fencegate's
// schema adds, beside each of fencegate's functions, an overload for every
// argument position and every type of overloadTypes (each one takes from
// a sequence of the role's and raises), then calls the interface on every
// path it has. None of them runs: every call inside fencegate's bodies
// matches its function's signature exactly (typed NULLs and literals;
// three calls passed an untyped NULL or '{}', and an overload taking text
// there ran with the owner's rights). A fresh install and one upgraded
// from before the function files.
func TestHostileOverloadsOfOwnFunctionsNeverRun(t *testing.T) {
	t.Parallel()
	for _, from := range []int64{0, lastWithoutFunctionFiles} {
		t.Run(fmt.Sprintf("from %d", from), func(t *testing.T) {
			t.Parallel()
			hostileOverloadsNeverRun(t, testdb.Schema(), from)
		})
	}
}

func hostileOverloadsNeverRun(t *testing.T, schema string, from int64) {
	ctx := context.Background()
	s, pool, role, hostile := hostileSetup(t, schema, from)
	// Every function of the schema, by its input argument types.
	rows, err := pool.Query(ctx, `SELECT p.proname, p.proargtypes::regtype[]::text[] FROM pg_proc p
		WHERE p.pronamespace = $1::regnamespace AND p.pronargs > 0 AND p.prokind = 'f' ORDER BY 1, 2`, s.Name())
	if err != nil {
		t.Fatal(err)
	}
	type fn struct {
		name string
		args []string
	}
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn, error) {
		var f fn
		return f, r.Scan(&f.name, &f.args)
	})
	if err != nil {
		t.Fatal(err)
	}
	exists := map[string]bool{}
	for _, f := range fns {
		exists[f.name+"("+strings.Join(f.args, ",")+")"] = true
	}

	const fired = "public.hostile_overload_fired"
	if _, err := hostile.Exec(ctx, `CREATE SEQUENCE `+fired+`; GRANT USAGE ON SEQUENCE `+fired+` TO PUBLIC`); err != nil {
		t.Fatal(err)
	}
	var made []string
	for _, f := range fns {
		// Not the interface's own entry points: an overload of those is in
		// the way of the caller's call (resolved in the caller's session,
		// run with the caller's rights), not of a call inside fencegate's
		// bodies; docs/sql.md tells callers to name their arguments.
		if slices.Contains([]string{"enqueue", "acquire", "renew", "release", "interface_version"}, f.name) {
			continue
		}
		for i := range f.args {
			for _, typ := range overloadTypes {
				args := slices.Clone(f.args)
				args[i] = typ
				sig := f.name + "(" + strings.Join(args, ",") + ")"
				if exists[sig] {
					continue
				}
				exists[sig] = true
				stmt := fmt.Sprintf(`CREATE FUNCTION %s.%s(%s) RETURNS void LANGUAGE plpgsql AS $h$
					BEGIN PERFORM nextval('%s'); RAISE EXCEPTION 'hostile overload %s ran' USING ERRCODE = 'ZH001'; END $h$`,
					s.Name(), f.name, strings.Join(args, ", "), fired, sig)
				if _, err := hostile.Exec(ctx, stmt); err != nil {
					t.Fatalf("as %s: %s: %v", role, stmt, err)
				}
				made = append(made, sig)
			}
		}
	}

	var epoch int64
	if err := hostile.QueryRow(ctx, s.SQL(`SELECT epoch FROM fencegate.acquire('r', 'H', interval '1 minute')`)).Scan(&epoch); err != nil {
		t.Fatalf("as %s: acquire: %v", role, err)
	}
	calls := 1
	for _, c := range hostileCalls(epoch) {
		calls++
		_, err := hostile.Exec(ctx, s.SQL(c.sql), c.args...)
		got := "ok"
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			got = pe.Code
		} else if err != nil {
			t.Fatalf("as %s: %s: %v", role, c.name, err)
		}
		if want := cmp.Or(c.code, "ok"); got != want {
			t.Errorf("as %s: %s: %s (%v); want %s", role, c.name, got, err, want)
		}
	}
	// Under a rule set (policy.sql's functions on every call), the role
	// mapped to a principal confined to r* and email.
	doc, err := policy.Parse([]byte(fmt.Sprintf(`{"principals": [{"name": "h", "role": "worker", "resources": ["r*"], "kinds": ["email"], "key_scope": "resource", "sql_roles": [%q]}]}`, role)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Apply(ctx, pool, schema, doc); err != nil {
		t.Fatalf("policy apply beside the overloads: %v", err)
	}
	const acq = `SELECT epoch FROM fencegate.acquire($1, $2, $3::interval)`
	if err := hostile.QueryRow(ctx, s.SQL(acq), "r-policy", "H", "1 minute").Scan(&epoch); err != nil {
		t.Fatalf("as %s under a rule set: acquire: %v", role, err)
	}
	const enq = `SELECT outcome FROM fencegate.enqueue(resource => $1, epoch => $2, operation_id => $3, kind => $4, payload => $5::jsonb)`
	for _, c := range []hostileCall{
		{"rule set: enqueue", enq, []any{"r-policy", epoch, "op-p", "email", mail}, ""},
		{"rule set: enqueue again", enq, []any{"r-policy", epoch, "op-p", "email", mail}, ""},
		{"rule set: enqueue a file", enq, []any{"r-policy", epoch, "op-f", "file", `{"target":"a","content":"x"}`}, "ZF007"},
		{"rule set: acquire outside", acq, []any{"x", "H", "1 minute"}, "ZF007"},
		{"rule set: acquire with a jump", `SELECT epoch FROM fencegate.acquire($1, $2, $3::interval, $4::bigint)`, []any{"r-policy", "H", "1 minute", int64(5)}, "ZF007"},
		{"rule set: renew", `SELECT fencegate.renew($1, $2, $3::bigint, $4::interval)`, []any{"r-policy", "H", epoch, "1 minute"}, ""},
		{"rule set: release", `SELECT fencegate.release($1, $2, $3::bigint)`, []any{"r-policy", "H", epoch}, ""},
	} {
		calls++
		_, err := hostile.Exec(ctx, s.SQL(c.sql), c.args...)
		got := "ok"
		if code, _, _ := pgCode(err); code != "" {
			got = code
		} else if err != nil {
			t.Fatalf("as %s: %s: %v", role, c.name, err)
		}
		if want := cmp.Or(c.code, "ok"); got != want {
			t.Errorf("as %s: %s: %s (%v); want %s", role, c.name, got, err, want)
		}
	}
	var taken bool
	if err := pool.QueryRow(ctx, `SELECT last_value IS NOT NULL FROM pg_sequences WHERE schemaname = 'public' AND sequencename = 'hostile_overload_fired'`).Scan(&taken); err != nil {
		t.Fatal(err)
	}
	t.Logf("schema %s: %d overloads of %d functions, %d calls of the interface", s.Name(), len(made), len(fns), calls)
	if taken {
		t.Errorf("the interface ran a hostile overload of one of fencegate's functions, with its owner's rights")
	}
	if len(made) < 100 || calls < 50 {
		t.Fatalf("%d overloads, %d calls: the check tried too little", len(made), calls)
	}
	// Called by name, an overload runs (else the check above proves nothing).
	_, err = hostile.Exec(ctx, fmt.Sprintf(`SELECT %s.%s`, s.Name(), strings.ReplaceAll(strings.ReplaceAll(made[0], ",", ", NULL::"), "(", "(NULL::")))
	if code, _, _ := pgCode(err); code != "ZH001" {
		t.Fatalf("calling the overload %s by name: %v; want it to run (ZH001)", made[0], err)
	}
}

func pgCode(err error) (code, column, message string) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code, pe.ColumnName, pe.Message
	}
	return "", "", ""
}
