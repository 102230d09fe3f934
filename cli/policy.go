package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/fencegate/fencegate/policy"
)

// cmdPolicy is `gateway policy apply FILE` and `gateway policy show`: the
// rule set kept in the database (package policy, docs/policy.md).
func cmdPolicy(ctx context.Context, a *app, args []string) int {
	if len(args) == 0 || (args[0] != "apply" && args[0] != "show") {
		return a.fail(badInput("command", "usage: gateway policy apply FILE|- , gateway policy show"))
	}
	sub := args[0]
	fs, dbURL := a.newFlags("policy " + sub)
	if code, ok := a.parse(fs, args[1:]); !ok {
		return code
	}
	var doc policy.Document
	if sub == "apply" {
		if fs.NArg() != 1 {
			return a.fail(badInput("file", "usage: gateway policy apply FILE (a JSON policy document; - reads standard input)"))
		}
		b, err := readPolicyFile(fs.Arg(0))
		if err != nil {
			return a.fail(badInput("file", err.Error()))
		}
		// Checked before connecting: a bad document is exit 2 naming
		// the field, with the database untouched.
		if doc, err = policy.Parse(b); err != nil {
			return a.fail(err)
		}
	} else if err := noArgs(fs); err != nil {
		return a.fail(err)
	}
	pool, err := a.connect(ctx, *dbURL)
	if err != nil {
		return a.fail(err)
	}
	defer pool.Close()
	if sub == "apply" {
		version, err := policy.Apply(ctx, pool, a.schema(), doc)
		if err != nil {
			return a.fail(err)
		}
		a.writeJSON(map[string]any{"version": version, "principals": len(doc.Principals)})
		return exitOK
	}
	cur, ok, err := policy.Current(ctx, pool, a.schema())
	if err != nil {
		return a.fail(err)
	}
	if !ok {
		a.writeJSON(map[string]any{"version": 0, "document": nil})
		return exitOK
	}
	a.writeJSON(cur)
	return exitOK
}

// readPolicyFile reads FILE, or standard input for "-", at most 1 MiB.
func readPolicyFile(name string) ([]byte, error) {
	var r io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, 1<<20+1))
	if err != nil {
		return nil, err
	}
	if len(b) > 1<<20 {
		return nil, fmt.Errorf("%s: over 1 MiB", name)
	}
	return b, nil
}
