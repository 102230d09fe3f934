package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// ttyResult is what a gateway process wrote with its stdout on a
// terminal.
type ttyResult struct {
	code   int
	stdout string // as the terminal got it, "\r\n" read as "\n"
	stderr string
}

// gwTTY runs the gateway with GATEWAY_DATABASE_URL=dbURL and its stdout on
// a pseudo-terminal, as in a person's shell.
func gwTTY(t *testing.T, dbURL string, args ...string) ttyResult {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock the pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetUint32(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("the pseudo-terminal's number: %v", err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gatewayBin, args...)
	cmd.Env = append(os.Environ(), "GATEWAY_DATABASE_URL="+dbURL)
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = pts, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child has its own copy: once it exits, reading the terminal
	// ends (EIO) after what it wrote.
	pts.Close()
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&out, ptmx); close(copied) }()
	err = cmd.Wait()
	<-copied
	r := ttyResult{stdout: strings.ReplaceAll(out.String(), "\r\n", "\n"), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// lineOf returns the line of table that begins with the id's column.
func lineOf(table, id string) string {
	for _, l := range strings.Split(table, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == id {
			return l
		}
	}
	return ""
}

// On a terminal ls, status and lease history print tables; piped, the
// JSON they always printed; -o json|table chooses either way. A table has
// one intent a line, its error on that line; status has the error whole.
func TestTablesOnATerminal(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	acquireLease(t, db, "reports/x")
	var ids []string
	for _, op := range []string{"a", "b", "c"} {
		ids = append(ids, jsonNum(enqueue(t, db, "--resource", "reports/x", "--epoch", "1", "--op", op, "--kind", "file",
			"--payload", `{"target":"`+op+`.txt","content":"x"}`)))
	}
	longErr := "webhook: 503 Service Unavailable\n" + strings.Repeat("upstream says no; ", 20)
	if _, err := conn.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET status = 'failed', completed_at = now(), attempts = 2,
		last_error = $2 WHERE intent_id = $1`), ids[0], longErr); err != nil {
		t.Fatal(err)
	}

	// Piped (the tests' stdout is a pipe): JSON, as before.
	r := gw(t, db, "ls")
	expectCode(t, r, 0, "")
	if intents, _ := r.obj["intents"].([]any); len(intents) != 3 {
		t.Fatalf("ls piped: %s", r.stdout)
	}

	for _, tr := range []ttyResult{gwTTY(t, db, "ls"), ttyResultOf(gwOut(t, nil, db, "ls", "-o", "table"))} {
		if tr.code != 0 || json.Valid([]byte(tr.stdout)) {
			t.Fatalf("ls on a terminal: exit %d, %q; want a table", tr.code, tr.stdout)
		}
		lines := strings.Split(strings.TrimSuffix(tr.stdout, "\n"), "\n")
		if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[0], "STATUS") || !strings.Contains(lines[0], "LAST ERROR") {
			t.Fatalf("ls table = %q; want a header and 3 lines", tr.stdout)
		}
		failed := lineOf(tr.stdout, ids[0])
		if f := strings.Fields(failed); len(f) < 8 || f[1] != "failed" || f[3] != "file" || f[4] != "reports/x" || f[6] != "2" ||
			!strings.Contains(failed, "webhook: 503 Service Unavailable upstream") || !strings.HasSuffix(failed, "…") {
			t.Errorf("failed intent's line = %q; want failed, file, reports/x, 2 attempts, its error on one line, shortened", failed)
		}
		if f := strings.Fields(lineOf(tr.stdout, ids[2])); len(f) < 9 || f[1] != "pending" || f[len(f)-1] != "-" {
			t.Errorf("pending intent's line = %v", f)
		}
	}
	tr := gwTTY(t, db, "ls", "--limit", "2")
	if !strings.Contains(tr.stdout, "more: the same command with --cursor "+ids[1]) {
		t.Errorf("ls --limit 2 on a terminal = %q; want the cursor of the next page", tr.stdout)
	}
	if tr := gwTTY(t, db, "ls", "--status", "succeeded"); tr.stdout != "no intents\n" {
		t.Errorf("ls of nothing on a terminal = %q", tr.stdout)
	}
	// -o json on a terminal: the JSON.
	tr = gwTTY(t, db, "ls", "-o", "json")
	var page struct{ Intents []map[string]any }
	if err := json.Unmarshal([]byte(tr.stdout), &page); err != nil || len(page.Intents) != 3 {
		t.Fatalf("ls -o json on a terminal = %q (%v)", tr.stdout, err)
	}

	tr = gwTTY(t, db, "status", ids[0])
	for _, want := range []string{"intent      " + ids[0] + "\n", "status      failed\n", "attempts    2\n", "resource    reports/x (epoch 1)\n",
		"last error  webhook: 503 Service Unavailable " + strings.TrimSpace(strings.Repeat("upstream says no; ", 20)) + "\n", "relayed     -\n"} {
		if !strings.Contains(tr.stdout, want) {
			t.Errorf("status on a terminal = %q; want %q", tr.stdout, want)
		}
	}
	if tr.code != 0 || !regexp.MustCompile(`\ncreated     20\d\d-\d\d-\d\d \d\d:\d\d:\d\d \S+ \((now|\d+[smhd] ago)\)\n`).MatchString(tr.stdout) {
		t.Errorf("status on a terminal: exit %d, %q; want the times with how long ago", tr.code, tr.stdout)
	}
	if tr := gwTTY(t, db, "status", ids[0], "-o", "json"); !json.Valid([]byte(tr.stdout)) || !strings.Contains(tr.stdout, `"status":"failed"`) {
		t.Errorf("status -o json on a terminal = %q", tr.stdout)
	}
	if r := gw(t, db, "status", ids[0]); r.obj["status"] != "failed" {
		t.Errorf("status piped = %s", r.stdout)
	}

	expectCode(t, gw(t, db, "lease", "acquire", "--resource", "reports/x", "--holder", "B", "--ttl", "30s"), 4, "lease_held")
	expectCode(t, gw(t, db, "epoch", "advance", "--resource", "reports/x", "--epoch", "9"), 0, "")
	tr = gwTTY(t, db, "lease", "history", "--resource", "reports/x")
	if tr.code != 0 || !strings.HasPrefix(tr.stdout, "EPOCH ") {
		t.Fatalf("lease history on a terminal: exit %d, %q", tr.code, tr.stdout)
	}
	if f := strings.Fields(lineOf(tr.stdout, "9")); len(f) < 3 || f[1] != "external_advance" || f[2] != "-" {
		t.Errorf("epoch 9's line = %v; want external_advance, no holder", f)
	}
	if f := strings.Fields(lineOf(tr.stdout, "1")); len(f) < 3 || f[1] != "free" || f[2] != "A" {
		t.Errorf("epoch 1's line = %v; want free, holder A", f)
	}
	if tr := gwTTY(t, db, "lease", "history", "--resource", "nothing-here"); tr.stdout != "no grants of nothing-here\n" {
		t.Errorf("lease history of nothing on a terminal = %q", tr.stdout)
	}
	if r := gw(t, db, "lease", "history", "--resource", "reports/x"); len(r.obj["grants"].([]any)) != 2 {
		t.Errorf("lease history piped = %s", r.stdout)
	}

	// -o takes json or table, checked before connecting.
	expectInvalidAnyDB(t, db, []invalidArgs{
		{[]string{"ls", "-o", "yaml"}, "output"},
		{[]string{"status", "1", "-o", "csv"}, "output"},
		{[]string{"lease", "history", "--resource", "r", "-o", "wide"}, "output"},
		// Given empty, it is not the default (a script's unset variable).
		{[]string{"ls", "-o", ""}, "output"},
	})
	t.Logf("tables checked: ls (%d intents), status, lease history (2 grants), on a terminal and with -o table", len(ids))
}

func ttyResultOf(r cliResult) ttyResult {
	return ttyResult{code: r.code, stdout: r.stdout, stderr: r.stderr}
}

// The attempts table says an error's class once: the runtime's errors
// already start with it ("permanent: webhook: …"), which the table showed
// as "permanent: permanent: webhook: …"; an error without it gets it.
func TestAttemptsTableSaysTheClassOnce(t *testing.T) {
	t.Parallel()
	str := func(s string) *string { return &s }
	attempts := []operator.Attempt{
		{Attempt: 1, Outcome: "failed", Error: str("permanent: webhook: 404 Not Found"), ErrorClass: str("permanent")},
		{Attempt: 2, Outcome: "unknown", Error: str("connection reset"), ErrorClass: str("unknown")},
	}
	var buf bytes.Buffer
	writeIntentTable(&buf, &outbox.Record{IntentID: 7, Status: outbox.StatusUnknown}, attempts, time.Now())
	out := buf.String()
	if strings.Contains(out, "permanent: permanent:") || !strings.Contains(out, "permanent: webhook: 404 Not Found") ||
		!strings.Contains(out, "unknown: connection reset") {
		t.Fatalf("attempts table:\n%s\nwant each class said once", out)
	}
}
