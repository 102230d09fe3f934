package pgschema

import (
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// unqualifiedRE matches a statement naming one of fencegate's tables, or
// calling one of its functions, without a schema.
var unqualifiedRE = regexp.MustCompile(`(?i)\b(from|join|into|update|table)\s+(intents|resources|idempotency_keys|epoch_grants|intent_events|deployment|epoch_authority)\b` +
	`|(^|[^\w.])(fencegate_enqueue|fencegate_enqueue_batch|fencegate_epoch_authority|fencegate_derived_namespace|fencegate_deployment_sysid|fencegate_system_identifier|fencegate_timeline_id)\s*\(`)

// Every statement in the Go code (tests included) names fencegate's
// tables and functions with their schema ("fencegate.intents", rewritten
// by Schema.SQL): an unqualified name would find an application's table
// of the same name first, or nothing, wherever the connection's
// search_path leads. Migrations run with search_path pinned instead.
func TestStatementsAreQualified(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "var" || d.Name() == "bin" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		file := fset.AddFile(p, -1, len(src))
		var s scanner.Scanner
		s.Init(file, src, nil, 0)
		for {
			pos, tok, lit := s.Scan()
			if tok == token.EOF {
				break
			}
			if tok != token.STRING {
				continue
			}
			checked++
			if m := unqualifiedRE.FindString(lit); m != "" && !allowedUnqualified(p, lit) {
				rel, _ := filepath.Rel(root, p)
				t.Errorf("%s:%d: %q names fencegate's object without its schema: write fencegate.<name> and run it through pgschema.Schema.SQL (testdb.SQL in tests)",
					rel, fset.Position(pos).Line, strings.TrimSpace(m))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 1000 {
		t.Fatalf("only %d string literals checked: the walk missed the module", checked)
	}
}

// allowedUnqualified: strings that are not fencegate's statements — an
// application's own tables in public (internal/testkit/testdb), the regular
// expressions that look for statements, and text for people.
func allowedUnqualified(path, lit string) bool {
	switch {
	case strings.Contains(lit, "public."):
		return true
	case strings.HasSuffix(path, "writers_test.go"), strings.HasSuffix(path, "qualified_test.go"):
		return true
	case strings.HasSuffix(path, filepath.Join("migrations", "functions_test.go")):
		// Its literals name functions as the catalog describes them
		// (pg_get_function_identity_arguments), not statements.
		return true
	}
	return false
}

func TestUnqualifiedRE(t *testing.T) {
	for _, s := range []string{"SELECT * FROM intents", "UPDATE resources SET", "INSERT INTO epoch_grants", "SELECT fencegate_enqueue($1)", "LOCK TABLE epoch_authority"} {
		if !unqualifiedRE.MatchString(s) {
			t.Errorf("%q not found", s)
		}
	}
	for _, s := range []string{"SELECT * FROM fencegate.intents", "UPDATE fencegate.resources SET", "SELECT fencegate.fencegate_enqueue($1)", "FROM intents_old", "count of intents"} {
		if unqualifiedRE.MatchString(s) {
			t.Errorf("%q found", s)
		}
	}
}

func TestRewrite(t *testing.T) {
	s := MustParse("app_fg")
	for in, want := range map[string]string{
		"SELECT * FROM fencegate.intents i JOIN fencegate.resources r":    "SELECT * FROM app_fg.intents i JOIN app_fg.resources r",
		"nextval('fencegate.idempotency_token_seq')":                      "nextval('app_fg.idempotency_token_seq')",
		"SELECT fencegate.fencegate_enqueue($1)":                          "SELECT app_fg.fencegate_enqueue($1)",
		"current_setting('fencegate.principal', true)":                    "current_setting('fencegate.principal', true)",
		"FROM fencegate.intentsx, xfencegate.intents, fencegate.enqueue(": "FROM fencegate.intentsx, xfencegate.intents, app_fg.enqueue(",
		"no schema here":    "no schema here",
		"fencegate.intents": "app_fg.intents",
		"SELECT 1 FROM fencegate.intents WHERE a = 'fencegate.failpoint' -- fencegate.": "SELECT 1 FROM app_fg.intents WHERE a = 'fencegate.failpoint' -- fencegate.",
	} {
		if got := s.SQL(in); got != want {
			t.Errorf("SQL(%q) = %q, want %q", in, got, want)
		}
		if got := (Schema{}).SQL(in); got != in {
			t.Errorf("default SQL(%q) = %q, want it unchanged", in, got)
		}
	}
	for _, bad := range []string{"", "App", "1a", "a-b", "pg_x", "information_schema", strings.Repeat("a", 41), "a;drop",
		// SQL's reserved words, which cannot name a schema unquoted (and
		// fencegate's SQL names it unquoted): CREATE SCHEMA user is a
		// syntax error.
		"user", "select", "order", "all", "left", "system_user"} {
		if _, err := Parse(bad); bad != "" && err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	// Keywords that may name a schema unquoted.
	for _, good := range []string{"int", "values", "none", "schema", "app_fg"} {
		if _, err := Parse(good); err != nil {
			t.Errorf("Parse(%q): %v", good, err)
		}
	}
	if s, err := Parse(""); err != nil || !s.IsDefault() || s.Name() != Default || s.IntentsChannel() != "fencegate_intents" || s.OutcomesChannel() != "fencegate_outcomes" {
		t.Errorf("Parse(\"\") = %v, %v; want the default schema with its channels", s, err)
	}
}
