package cli

import (
	"bytes"
	"context"
	"flag"
	"slices"
	"strings"
	"testing"
	"time"
)

// runMain runs one command line in this process, with env as the whole
// environment, and returns its exit code, stdout and stderr.
func runMain(env map[string]string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := Main(context.Background(), args, Options{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return env[k] }})
	return code, out.String(), errOut.String()
}

// flagEntries splits a command's help at its flags: one string per flag,
// its lines joined.
func flagEntries(t *testing.T, help string) map[string]string {
	t.Helper()
	_, flags, ok := strings.Cut(help, "\nFlags:\n")
	if !ok {
		t.Fatalf("no Flags: section in\n%s", help)
	}
	entries := map[string]string{}
	var name string
	for _, line := range strings.Split(flags, "\n") {
		switch {
		case strings.HasPrefix(line, "  -"):
			name = strings.TrimLeft(strings.Fields(line)[0], "-")
			entries[name] = ""
		case strings.HasPrefix(line, "      ") && name != "":
			entries[name] = strings.TrimSpace(entries[name] + " " + strings.TrimSpace(line))
		}
	}
	return entries
}

// Every command's --help, and `gateway help COMMAND`, is on stdout with
// exit 0: the command's one line, its usage, an example and its flags,
// each flag written --name and its default said once. The overview
// (--help, -h, help) lists every command; `gateway` alone is a usage
// error (stderr, exit 2).
func TestHelp(t *testing.T) {
	t.Parallel()
	env := map[string]string{"GATEWAY_SCHEMA": "fencegate", "GATEWAY_DATABASE_URL": "postgres://app:pw@db.example/app", "GATEWAY_NATS_URL": "nats://n.example:4222"}
	flagsChecked := 0
	for _, d := range commandDocs {
		args := append(strings.Fields(d.name), "--help")
		code, out, errOut := runMain(env, args...)
		if code != exitOK || errOut != "" {
			t.Errorf("gateway %s --help: exit %d, stderr %q; want exit 0, nothing on stderr", d.name, code, errOut)
			continue
		}
		if !strings.HasPrefix(out, "gateway "+d.name+": "+d.summary+"\n") || !strings.Contains(out, "\nExample:\n  gateway ") {
			t.Errorf("gateway %s --help does not begin with its line or has no example:\n%s", d.name, out)
		}
		for name, text := range flagEntries(t, out) {
			flagsChecked++
			if strings.Contains(text, "pw@") {
				t.Errorf("gateway %s --help: --%s shows a password: %q", d.name, name, text)
			}
		}
		if !strings.Contains(out, "\n  --database-url string\n") && !slices.Contains([]string{"token new", "probe"}, d.name) {
			t.Errorf("gateway %s --help: no --database-url flag written --name:\n%s", d.name, out)
		}
		helpArgs := append([]string{"help"}, strings.Fields(d.name)...)
		if code, out2, _ := runMain(env, helpArgs...); code != exitOK || out2 != out {
			t.Errorf("gateway help %s: exit %d, %d bytes; want exit 0 and what --help prints", d.name, code, len(out2))
		}
	}
	// Defaults that were written twice (the flag's text says it, and
	// flag.PrintDefaults added it again): said once.
	for _, c := range []struct{ cmd, flag string }{{"ls", "schema"}, {"status", "database-url"}, {"run", "nats-url"}, {"run", "adapters"}, {"run", "allow-fsync-off"}} {
		_, out, _ := runMain(env, c.cmd, "--help")
		if s := flagEntries(t, out)[c.flag]; strings.Count(s, "default") != 1 {
			t.Errorf("%s --help: --%s %q, want its default said once", c.cmd, c.flag, s)
		}
	}
	if code, out, errOut := runMain(env, "lease", "acquire", "-h"); code != exitOK || !strings.HasPrefix(out, "gateway lease acquire: ") || errOut != "" {
		t.Errorf("lease acquire -h: exit %d, %q, %q", code, out, errOut)
	}

	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, out, errOut := runMain(env, args...)
		if code != exitOK || errOut != "" {
			t.Fatalf("gateway %v: exit %d, stderr %q", args, code, errOut)
		}
		for _, d := range commandDocs {
			if !strings.Contains(out, "  "+d.name+" ") || !strings.Contains(out, d.summary) {
				t.Errorf("gateway %v does not list %s with its line", args, d.name)
			}
		}
	}
	if code, out, errOut := runMain(env); code != exitBadInput || out != "" || !strings.Contains(errOut, "Commands:") {
		t.Errorf("gateway alone: exit %d, stdout %q; want exit 2, the overview on stderr", code, out)
	}
	for group := range groupDocs {
		for _, args := range [][]string{{group, "--help"}, {"help", group}} {
			code, out, _ := runMain(env, args...)
			if code != exitOK || !strings.HasPrefix(out, "gateway "+group+": ") || !strings.Contains(out, "  gateway "+group+" ") {
				t.Errorf("gateway %v: exit %d:\n%s", args, code, out)
			}
		}
	}
	// Usage errors stay errors: the JSON error on stdout, one line on
	// stderr, exit 2.
	for _, args := range [][]string{{"help", "nope"}, {"ls", "--nope"}, {"lease", "steal", "--help"}} {
		code, out, errOut := runMain(env, args...)
		if code != exitBadInput || !strings.HasPrefix(out, `{"error":`) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("gateway %v: exit %d, stdout %q, stderr %q; want exit 2 and the error object", args, code, out, errOut)
		}
	}
	if flagsChecked == 0 {
		t.Fatal("no flag checked")
	}
	t.Logf("%d commands' help checked, %d flag entries", len(commandDocs), flagsChecked)
}

// A value of the wrong form is refused with an example of the right one,
// on the command line and in the environment; unknown flags are named as
// the help writes them.
func TestFlagErrorsGiveExamples(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env   []string
		args  []string
		field string
		msg   string
	}{
		{nil, []string{"lease", "acquire", "--resource", "r", "--holder", "h", "--ttl", "10"}, "ttl",
			`invalid value "10" for flag --ttl: a duration such as 10s, 1m30s`},
		{nil, []string{"status", "1", "--wait", "soon"}, "wait", `invalid value "soon" for flag --wait: a duration such as 10s, 1m30s`},
		{nil, []string{"lease", "history", "--resource", "r", "--limit", "many"}, "limit",
			`invalid value "many" for flag --limit: a whole number such as 5`},
		{nil, []string{"retry", "--status", "failed", "--yes=maybe"}, "yes", `invalid value "maybe" for flag --yes: true or false`},
		{nil, []string{"ls", "--bogus"}, "flags", "unknown flag --bogus (see gateway ls --help)"},
		{nil, []string{"lease", "acquire", "--ttl"}, "ttl", "flag --ttl needs a value"},
		{nil, []string{"ls", "-o"}, "output", "flag -o needs a value"},
		{[]string{"GATEWAY_CLAIM_TTL=30"}, []string{"run", "--adapters", ""}, "claim_ttl",
			"$GATEWAY_CLAIM_TTL is not a valid value for --claim-ttl: a duration such as 10s, 1m30s"},
	} {
		r := gwEnv(t, c.env, unreachableDB, c.args...)
		expectCode(t, r, exitBadInput, "invalid_input")
		e := r.obj["error"].(map[string]any)
		if e["field"] != c.field || e["message"] != c.msg || strings.TrimSpace(r.stderr) != "gateway: "+c.msg {
			t.Errorf("gateway %v: %s, stderr %q; want field %s, message %q", c.args, r.stdout, r.stderr, c.field, c.msg)
		}
	}
}

// printFlags adds a flag's default only where its text does not say it,
// and never a zero value.
func TestPrintFlagsSaysDefaultsOnce(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("gateway x", flag.ContinueOnError)
	fs.String("schema", "fencegate", "schema (default $GATEWAY_SCHEMA, else fencegate)")
	fs.String("adapters", "email,file", "adapters to run; default email,file")
	fs.Duration("ttl", 10*time.Second, "lease time to live")
	fs.String("kind", "", "only this kind")
	fs.Bool("yes", false, "do it")
	fs.String("o", "", "output: `json|table`")
	var b strings.Builder
	printFlags(&b, fs)
	want := `  --adapters string
      adapters to run; default email,file
  --kind string
      only this kind
  -o json|table
      output: json|table
  --schema string
      schema (default $GATEWAY_SCHEMA, else fencegate)
  --ttl duration
      lease time to live (default 10s)
  --yes
      do it
`
	if b.String() != want {
		t.Fatalf("printFlags =\n%s\nwant\n%s", b.String(), want)
	}
}
