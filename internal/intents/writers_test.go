package intents

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// writerRE matches a statement that changes the intents table, or locks
// its rows (a locking read takes part in the lock order), in any case and
// spacing (intent_events and other tables do not match).
var writerRE = regexp.MustCompile(`(?i)\b(update|delete\s+from|insert\s+into)\s+(\w+\.)?intents\b` +
	"|(?is)\\bfrom\\s+(\\w+\\.)?intents\\b[^`;]*?\\bfor\\s+(no\\s+key\\s+)?(update|share)\\b")

// allowed are the non-test files outside this package that may write the
// intents table, by slash path from the module root (path.Match patterns),
// each with its reason.
var allowed = map[string]string{
	// The benchmark's physical baseline (a raw INSERT with no fence, no
	// lock, no dedup: what an enqueue costs at least) and its reset between
	// cases are deliberately not the gateway's statements.
	"cli/internal/bench/*.go": "benchmark baseline and reset",
	// An application's own table called intents, in public: the tests'
	// databases have one, so that a statement of fencegate's that named
	// intents without its schema would fail.
	"internal/testkit/testdb/*.go": "an application's table public.intents",
}

// TestOneOwnerOfIntentSQL fails when a statement that changes intents
// appears in a non-test Go file outside this package (test/ holds the
// end-to-end suites, which set up states by hand) that is not allowed
// above, and when an allowed entry no longer matches a writer.
func TestOneOwnerOfIntentSQL(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	used := map[string]bool{}
	files := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch {
			case rel != "." && strings.HasPrefix(d.Name(), "."), d.Name() == "testdata", d.Name() == "vendor",
				rel == "test", rel == "internal/intents", rel == "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		files++
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		locs := writerRE.FindAllIndex(b, -1)
		if len(locs) == 0 {
			return nil
		}
		for pattern := range allowed {
			if ok, _ := path.Match(pattern, rel); ok {
				used[pattern] = true
				return nil
			}
		}
		for _, l := range locs {
			line := 1 + strings.Count(string(b[:l[0]]), "\n")
			t.Errorf("%s:%d: %q changes the intents table outside internal/intents; add a function there and call it", rel, line, b[l[0]:l[1]])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("looked at %d Go files under %s; the walk is broken", files, root)
	}
	for pattern, why := range allowed {
		if !used[pattern] {
			t.Errorf("allowed %s (%s) matches no file that writes intents: remove the entry", pattern, why)
		}
	}
}

func TestWriterRE(t *testing.T) {
	for _, s := range []string{
		"UPDATE intents SET", "update intents i", "DELETE FROM intents WHERE", "delete  from\n\tintents",
		"INSERT INTO intents (", "Insert Into intents(", "UPDATE\n\tintents",
		"SELECT status FROM intents WHERE intent_id = $1 FOR UPDATE", "select 1 from intents\n where x for no key update",
		// qualified with the schema (internal/pgschema), as every statement is
		"UPDATE fencegate.intents SET", "DELETE FROM fencegate.intents WHERE", "INSERT INTO fencegate.intents (",
		"SELECT status FROM fencegate.intents WHERE intent_id = $1 FOR UPDATE",
	} {
		if !writerRE.MatchString(s) {
			t.Errorf("%q not recognised as a writer", s)
		}
	}
	for _, s := range []string{
		"SELECT * FROM intents", "INSERT INTO intent_events", "UPDATE idempotency_keys", "DELETE FROM intents_old",
		"UPDATE myintents", "SELECT * FROM intents WHERE a; SELECT 1 FROM keys FOR UPDATE",
		"SELECT * FROM fencegate.intents", "INSERT INTO fencegate.intent_events", "UPDATE fencegate.idempotency_keys",
	} {
		if writerRE.MatchString(s) {
			t.Errorf("%q recognised as a writer", s)
		}
	}
}
