package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/adapters/s3"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/gateway"
)

// runFlagDefaults returns every flag of `gateway run` with its default, as
// --print-config prints it with an empty environment (secrets are empty
// by default, so nothing is redacted).
func runFlagDefaults(t *testing.T) map[string]string {
	t.Helper()
	var out bytes.Buffer
	a := &app{stdout: &out, stderr: io.Discard, getenv: func(string) string { return "" }}
	if code := cmdRun(context.Background(), a, []string{"--print-config"}); code != exitOK {
		t.Fatalf("gateway run --print-config: exit %d: %s", code, out.String())
	}
	var pc struct{ Config map[string]string }
	if err := json.Unmarshal(out.Bytes(), &pc); err != nil || len(pc.Config) == 0 {
		t.Fatalf("gateway run --print-config printed %q (%v), want its flags", out.String(), err)
	}
	// --print-config leaves itself out.
	pc.Config["print-config"] = "false"
	return pc.Config
}

// docFlagRow is one flag of the table in docs/operations.md.
type docFlagRow struct {
	line int
	def  string // the default column
}

// docFlagTable reads the flag table of docs/operations.md ("| flag |
// environment | default | |"): each row's flags (a row may name several,
// sharing the default) and its default column.
func docFlagTable(t *testing.T) map[string]docFlagRow {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	flagName := regexp.MustCompile("`--([a-z0-9-]+)`")
	rows := map[string]docFlagRow{}
	in := false
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "| flag | environment | default |"):
			in = true
			continue
		case !in:
			continue
		case !strings.HasPrefix(line, "|"):
			if len(rows) > 0 {
				return rows
			}
			continue
		case strings.HasPrefix(line, "|---"), strings.HasPrefix(line, "| **"):
			continue // the separator, a section's heading
		}
		cells := strings.Split(line, "|")
		if len(cells) < 5 {
			t.Fatalf("docs/operations.md:%d: a row of the flag table with fewer than 4 columns", i+1)
		}
		names := flagName.FindAllStringSubmatch(cells[1], -1)
		if len(names) == 0 {
			t.Fatalf("docs/operations.md:%d: a row of the flag table names no flag", i+1)
		}
		for _, n := range names {
			if _, dup := rows[n[1]]; dup {
				t.Errorf("docs/operations.md:%d: --%s is in the table twice", i+1, n[1])
			}
			rows[n[1]] = docFlagRow{line: i + 1, def: strings.TrimSpace(cells[3])}
		}
	}
	return rows
}

// docDefaultMatches reports whether the table's default column says the
// flag's default value v: the column's first word (backticks stripped),
// compared as a duration, a number or a word; a flag without a default
// value ("") is described in words (none, off, any, host-pid-random, …).
func docDefaultMatches(col, v string) bool {
	if col == "" {
		return false // the default is not said
	}
	first := strings.Trim(strings.FieldsFunc(col, func(r rune) bool { return r == ' ' || r == '(' })[0], "`")
	if v == "" {
		// A description, not a value: no backticks, nothing that parses.
		_, errD := time.ParseDuration(first)
		_, errN := strconv.ParseFloat(first, 64)
		return !strings.HasPrefix(col, "`") && errD != nil && errN != nil && first != "true" && first != "false"
	}
	if d, err := time.ParseDuration(v); err == nil && v != "0" {
		dd, err := time.ParseDuration(first)
		return err == nil && dd == d
	}
	switch {
	case v == "false" && first == "off", v == "true" && first == "on":
		return true
	}
	return first == v
}

// TestFlagTable keeps docs/operations.md's table of `gateway run`'s flags
// equal to the flag set: every flag is in the table and every flag in the
// table is one, with its default.
func TestFlagTable(t *testing.T) {
	t.Parallel()
	flags := runFlagDefaults(t)
	rows := docFlagTable(t)
	var names []string
	for name := range flags {
		names = append(names, name)
	}
	slices.Sort(names)
	checked := 0
	for _, name := range names {
		row, ok := rows[name]
		if !ok {
			t.Errorf("--%s (default %q) is not in docs/operations.md's flag table", name, flags[name])
			continue
		}
		if !docDefaultMatches(row.def, flags[name]) {
			t.Errorf("docs/operations.md:%d: --%s's default is %q, the table says %q", row.line, name, flags[name], row.def)
		}
		checked++
	}
	for name, row := range rows {
		if _, ok := flags[name]; !ok {
			t.Errorf("docs/operations.md:%d: --%s is in the flag table but gateway run has no such flag", row.line, name)
		}
	}
	if checked == 0 {
		t.Fatal("no flag checked")
	}
	t.Logf("%d flags of gateway run checked against docs/operations.md (%d rows)", checked, len(rows))
}

// TestFlagFields: every field a table maps (flagFields for gateway.Config,
// each built-in adapter's for its Config) is a field of that Config and
// names a flag of gateway run, once.
func TestFlagFields(t *testing.T) {
	t.Parallel()
	flags := runFlagDefaults(t)
	checked := 0
	for _, tc := range []struct {
		table fieldFlags
		cfg   any
	}{
		{flagFields, gateway.Config{}},
		{emailFields, email.Config{}},
		{fileFields, file.Config{}},
		{webhookFields, webhook.Config{}},
		{s3Fields, s3.Config{}},
	} {
		typ := reflect.TypeOf(tc.cfg)
		seen := map[string]bool{}
		for _, f := range tc.table {
			if _, ok := flags[f.flag]; !ok {
				t.Errorf("%s: %s maps to --%s, which gateway run does not have", typ, f.path, f.flag)
			}
			if !hasField(typ, f.path) {
				t.Errorf("%s has no field %s", typ, f.path)
			}
			if seen[f.path] {
				t.Errorf("%s: %s is mapped twice", typ, f.path)
			}
			seen[f.path] = true
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no field checked")
	}
	t.Logf("%d fields mapped to flags", checked)
}

// hasField reports whether the struct typ has the field at path
// ("Runtime.MaxAttempts"); the path may go on below an interface field
// (email.Config's Lookup.BaseURL), which is not followed.
func hasField(typ reflect.Type, path string) bool {
	for name := range strings.SplitSeq(path, ".") {
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		if typ.Kind() == reflect.Interface {
			return true
		}
		if typ.Kind() != reflect.Struct {
			return false
		}
		f, ok := typ.FieldByName(name)
		if !ok {
			return false
		}
		typ = f.Type
	}
	return true
}
