package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// maxReadmeLines bounds the README: it is the front door, and the long
// documentation lives in docs/.
const maxReadmeLines = 300

// TestReadmeIsAFrontDoor checks that README.md stays under maxReadmeLines.
func TestReadmeIsAFrontDoor(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := countLines(string(b)); n >= maxReadmeLines {
		t.Errorf("README.md has %d lines, want fewer than %d: move the detail into docs/", n, maxReadmeLines)
	}
}

// TestMarkdownLinksResolve checks every relative link of README.md and
// docs/*.md: the file it names exists, and a #anchor is produced by a
// heading of that file (GitHub's anchors).
func TestMarkdownLinksResolve(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no docs/*.md found")
	}
	files = append([]string{"../../README.md"}, files...)
	for _, problem := range checkLinks(t, files) {
		t.Error(problem)
	}
}

// TestLinkCheckerFindsBrokenLinks shows that checkLinks reports a missing
// file and a missing anchor, and nothing else, so a green
// TestMarkdownLinksResolve means something.
func TestLinkCheckerFindsBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("b.md", "# B\n\n## `gateway run`: the relay\n\n## Try it: `gateway dev --demo`\n\n## Twice\n\n## Twice\n\n```\n## not a heading\n```\n")
	a := write("a.md", strings.Join([]string{
		"# A",
		"[ok](b.md) [ok](b.md#gateway-run-the-relay) [ok](b.md#try-it-gateway-dev---demo)",
		"[ok](b.md#twice-1) [ok](#a) [ok](https://example.com/x.md#nowhere) `[code](nowhere.md)`",
		"[missing file](c.md)",
		"[missing anchor](b.md#twice-2)",
		"[heading in code](b.md#not-a-heading)",
		"[missing here](#b)",
		"",
		"```",
		"[in a code block](nowhere.md)",
		"```",
		"[ref]: d.md",
	}, "\n"))
	got := checkLinks(t, []string{a})
	want := []string{"c.md", "b.md#twice-2", "b.md#not-a-heading", "#b", "d.md"}
	if len(got) != len(want) {
		t.Fatalf("checkLinks found %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i, w := range want {
		if !strings.Contains(got[i], "("+w+")") {
			t.Errorf("problem %d: %s, want one about (%s)", i, got[i], w)
		}
	}
}

// TestReadmeWorkerIsTheExample checks that the README's Go worker is the
// code that outbox's Example_worker runs and checks (// Output:).
func TestReadmeWorkerIsTheExample(t *testing.T) {
	const file, fn = "../../outbox/example_worker_test.go", "sendNightlyReport"
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var code string
	for _, d := range f.Decls {
		if d, ok := d.(*ast.FuncDecl); ok && d.Name.Name == fn {
			code = string(src[fset.Position(d.Pos()).Offset:fset.Position(d.End()).Offset])
		}
	}
	if code == "" {
		t.Fatalf("%s has no func %s", file, fn)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range goBlocks(string(readme)) {
		if strings.Contains(block, code) {
			return
		}
	}
	t.Errorf("README.md has no ```go block with func %s exactly as in %s:\n%s", fn, file, code)
}

var (
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]*)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*(\S+)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	scheme     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$`)
	mdLink     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// checkLinks returns one line per relative link of files that does not
// resolve, in file and link order.
func checkLinks(t *testing.T, files []string) []string {
	t.Helper()
	anchors := map[string][]string{} // cleaned path -> anchors of its headings
	anchorsOf := func(path string) []string {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		anchors[path] = headingAnchors(string(b))
		return anchors[path]
	}
	var problems []string
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		prose := codeSpan.ReplaceAllString(strings.Join(outsideFences(string(b)), "\n"), "")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(prose, -1) {
			targets = append(targets, m[1])
		}
		for _, m := range refLink.FindAllStringSubmatch(prose, -1) {
			targets = append(targets, m[1])
		}
		name := filepath.Base(file)
		for _, target := range targets {
			if scheme.MatchString(target) {
				continue // http:, https:, mailto:: not ours to check
			}
			path, anchor, _ := strings.Cut(target, "#")
			dest := filepath.Clean(file)
			if path != "" {
				dest = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(dest); err != nil {
					problems = append(problems, fmt.Sprintf("%s: link (%s): no such file %s", name, target, path))
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				problems = append(problems, fmt.Sprintf("%s: link (%s): an anchor into a file that is not markdown", name, target))
				continue
			}
			if !slices.Contains(anchorsOf(dest), anchor) {
				problems = append(problems, fmt.Sprintf("%s: link (%s): no heading in %s gives #%s (it has: %s)",
					name, target, filepath.Base(dest), anchor, strings.Join(anchorsOf(dest), " ")))
			}
		}
	}
	return problems
}

// outsideFences returns the lines of a markdown text that are not inside a
// fenced code block.
func outsideFences(text string) []string {
	var out []string
	fence := ""
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]+" \t") == "" {
				fence = ""
			}
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			fence = trimmed[:3]
		default:
			out = append(out, line)
		}
	}
	return out
}

// goBlocks returns the contents of the ```go fenced blocks of a text.
func goBlocks(text string) []string {
	var blocks []string
	var cur []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		switch {
		case !in && strings.TrimSpace(line) == "```go":
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

// headingAnchors returns the anchors GitHub gives a text's headings, in
// order: the heading's text without its markup, lowercased, with every
// character but letters, digits, '_', '-' and spaces dropped and spaces
// made '-'; a repeated anchor gets -1, -2, ….
func headingAnchors(text string) []string {
	var out []string
	seen := map[string]int{}
	for _, line := range outsideFences(text) {
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		h := mdLink.ReplaceAllString(m[2], "$1")
		h = strings.NewReplacer("`", "", "*", "").Replace(h)
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

// countLines counts the lines of a text, a last line without a newline
// included.
func countLines(text string) int {
	n := strings.Count(text, "\n")
	if text != "" && !strings.HasSuffix(text, "\n") {
		n++
	}
	return n
}

// TestArchitectureNamesEveryPackage checks that docs/architecture.md's
// package table names every package of the module (each directory holding
// Go files, relative to the root, in backquotes), and nothing that is not
// one: the map for newcomers stays whole as packages come and go.
func TestArchitectureNamesEveryPackage(t *testing.T) {
	b, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	pkgs := map[string]bool{}
	err = filepath.WalkDir("../..", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata", "var", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") {
			rel, _ := filepath.Rel("../..", filepath.Dir(p))
			pkgs[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 30 {
		t.Fatalf("only %d packages found: the walk missed the module", len(pkgs))
	}
	var missing []string
	for p := range pkgs {
		if p != "." && !strings.Contains(doc, "`"+p+"`") {
			missing = append(missing, p)
		}
	}
	slices.Sort(missing)
	t.Logf("%d packages, %d not named in docs/architecture.md", len(pkgs), len(missing))
	if len(missing) > 0 {
		t.Errorf("docs/architecture.md does not name these packages (in backquotes): %v", missing)
	}
	// And each row of the table names a directory of the module.
	rows := 0
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		rows++
		name := strings.SplitN(strings.TrimPrefix(line, "| `"), "`", 2)[0]
		if _, err := os.Stat(filepath.Join("../..", name)); err != nil {
			t.Errorf("docs/architecture.md has a row for %q, which is not a directory of the module", name)
		}
	}
	if rows == 0 {
		t.Error("docs/architecture.md has no package rows")
	}
}
