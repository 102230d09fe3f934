package executor

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The list of outcome label values that start at 0 (outcomeLabels) holds
// every outcome the runtime counts: a literal outcome given to
// m.outcomes.WithLabelValues in this package's code is in it (the one
// counted from a status, string(out.Status), is an Execute's: succeeded or
// superseded, in it too).
func TestOutcomeLabelsListEveryOutcome(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "WithLabelValues" {
				return true
			}
			if vec, ok := sel.X.(*ast.SelectorExpr); !ok || vec.Sel.Name != "outcomes" {
				return true
			}
			seen++
			lit, ok := call.Args[1].(*ast.BasicLit)
			if !ok {
				return true // string(out.Status)
			}
			v, _ := strconv.Unquote(lit.Value)
			if !slices.Contains(outcomeLabels, v) {
				t.Errorf("%s: outcome %q is counted but not in outcomeLabels: its series do not start at 0", fset.Position(lit.Pos()), v)
			}
			return true
		})
	}
	if seen < 20 {
		t.Fatalf("found %d counts of an outcome, want the runtime's (over 20)", seen)
	}
}
