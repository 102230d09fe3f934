package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/cli/internal/devenv"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// devProc is a running `gateway dev`.
type devProc struct {
	cmd     *exec.Cmd
	stderr  *syncBuffer
	extra   *syncBuffer // stdout after the ready object: must stay empty
	ready   devenv.Ready
	readyIn time.Duration
	done    chan struct{}
	err     error
}

func devFreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startDev runs `gateway dev args...` with no services configured in the
// environment and waits for its ready object on stdout. The process is
// killed at the test's end if still running.
func startDev(t *testing.T, args ...string) *devProc {
	t.Helper()
	cmd := exec.Command(gatewayBin, append([]string{"dev"}, args...)...)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GATEWAY_DATABASE_URL=") && !strings.HasPrefix(kv, "GATEWAY_NATS_URL=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	p := &devProc{cmd: cmd, stderr: &syncBuffer{}, extra: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		n := 0
		for sc.Scan() {
			if n++; n == 1 {
				first <- sc.Text()
			} else {
				// Only one object may ever be written; see interrupt.
				fmt.Fprintln(p.extra, sc.Text())
			}
		}
		close(first)
		p.err = cmd.Wait()
		close(p.done)
	}()
	killAtEnd(t, "gateway dev", cmd, p.done, p.stderr)
	select {
	case line, ok := <-first:
		if !ok {
			<-p.done
			t.Fatalf("gateway dev exited before it was ready: %v", p.err)
		}
		if err := json.Unmarshal([]byte(line), &p.ready); err != nil {
			t.Fatalf("ready line %q: %v", line, err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("gateway dev not ready in 90s")
	}
	p.readyIn = time.Since(began)
	t.Logf("gateway dev ready in %s", p.readyIn.Round(time.Millisecond))
	return p
}

// interrupt sends SIGINT and waits (bounded) for a clean exit.
func (p *devProc) interrupt(t *testing.T) time.Duration {
	t.Helper()
	began := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(45 * time.Second):
		t.Fatal("gateway dev did not exit within 45s of SIGINT")
	}
	if p.err != nil {
		t.Fatalf("gateway dev exited with %v after SIGINT", p.err)
	}
	if extra := p.extra.String(); extra != "" {
		t.Errorf("gateway dev wrote more than one object on stdout: %s", extra)
	}
	took := time.Since(began)
	t.Logf("gateway dev stopped %s after SIGINT", took.Round(time.Millisecond))
	return took
}

// devProcessGone reports whether pid no longer exists, waiting a little: the
// postmaster is reaped by gateway dev before it exits, so no zombie stays.
func devProcessGone(pid int) bool {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Kill(pid, 0)
		if errors.Is(err, syscall.ESRCH) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func devPortClosed(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return true
	}
	c.Close()
	return false
}

func devNATSAddr(t *testing.T, natsURL string) string {
	t.Helper()
	if !strings.HasPrefix(natsURL, "nats://") {
		t.Fatalf("nats_url %q", natsURL)
	}
	return strings.TrimPrefix(natsURL, "nats://")
}

// demoIntent is one row of the demo resource's intents.
type demoIntent struct {
	op     string
	epoch  int64
	kind   string
	status string
}

// waitDemo polls the database until the demo's intents are all succeeded
// and the demo said it is done.
func waitDemo(t *testing.T, p *devProc, conn *pgx.Conn) []demoIntent {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(90 * time.Second)
	for {
		rows, err := conn.Query(ctx, testdb.SQL(`SELECT operation_id, epoch, kind, status FROM fencegate.intents WHERE resource_id = 'nightly-report' ORDER BY intent_id`))
		if err != nil {
			t.Fatal(err)
		}
		var got []demoIntent
		for rows.Next() {
			var r demoIntent
			if err := rows.Scan(&r.op, &r.epoch, &r.kind, &r.status); err != nil {
				t.Fatal(err)
			}
			got = append(got, r)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		done := strings.Contains(p.stderr.String(), "demo: done")
		ok := len(got) > 0
		for _, r := range got {
			// A's publication delayed in transit ends superseded at the
			// file destination; every other intent succeeds.
			want := "succeeded"
			if strings.HasPrefix(r.op, "A-report-in-transit-") {
				want = "superseded"
			}
			ok = ok && r.status == want
			switch r.status {
			case "failed", "superseded", "unknown", "cancelled", "succeeded":
				if r.status != want {
					t.Fatalf("demo intent %+v ended %s, want %s; all: %+v", r, r.status, want, got)
				}
			}
		}
		if done && ok {
			return got
		}
		if strings.Contains(p.stderr.String(), "demo: failed") {
			t.Fatalf("demo failed; intents %+v", got)
		}
		select {
		case <-p.done:
			t.Fatalf("gateway dev exited during the demo: %v; intents %+v", p.err, got)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo not done in 90s; intents %+v", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkDemo checks one finished demo run: A's stale write left nothing, B's
// intents succeeded, and the file holds B's report. It returns B's epoch.
func checkDemo(t *testing.T, p *devProc, intents []demoIntent, fileRoot string) int64 {
	t.Helper()
	var bEpoch int64
	for _, r := range intents {
		if strings.HasPrefix(r.op, "A-") && !strings.HasPrefix(r.op, "A-report-in-transit-") {
			t.Errorf("A's stale write was stored: %+v", r)
		}
		if strings.HasPrefix(r.op, "B-report-") {
			bEpoch = r.epoch
		}
	}
	if bEpoch == 0 {
		t.Fatalf("no file intent of B among %+v", intents)
	}
	var kinds []string
	for _, r := range intents {
		if r.epoch == bEpoch && strings.HasPrefix(r.op, "B-") {
			kinds = append(kinds, r.kind)
		}
	}
	if strings.Join(kinds, ",") != "file,email,webhook" {
		t.Errorf("B's intents (epoch %d) are %v, want a file, an email and a webhook", bEpoch, kinds)
	}
	b, err := os.ReadFile(filepath.Join(fileRoot, "reports", "nightly.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("report by B, epoch %d", bEpoch); string(b) != want {
		t.Errorf("published file = %q, want %q", b, want)
	}
	logs := p.stderr.String()
	for _, want := range []string{
		fmt.Sprintf("A's write with epoch %d was rejected: current epoch is %d", bEpoch-1, bEpoch),
		fmt.Sprintf("arrived late and was refused at the file destination: superseded, reports/nightly.txt holds epoch %d", bEpoch),
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	return bEpoch
}

func TestDevDemoStartsEverythingAndStopsClean(t *testing.T) {
	t.Parallel()
	fileRoot := t.TempDir()
	// --schema as the tests' (the default in one pass, fg_alt in the other).
	p := startDev(t, "--demo", "--addr", devFreeAddr(t), "--file-root", fileRoot, "--schema", testdb.Schema())
	r := p.ready
	if r.AdminURL == "" || r.NATSURL == "" || r.DatabaseURL == "" || r.SMTPAddr == "" || r.FileRoot != fileRoot ||
		r.PostgresPID <= 0 || r.DataDir == "" || r.DataDirKept || !r.Demo {
		t.Fatalf("ready object %+v", r)
	}
	if p.readyIn > 30*time.Second {
		t.Errorf("ready after %s, want a few seconds", p.readyIn)
	}
	if _, err := os.Stat(r.DataDir); err != nil {
		t.Fatalf("data dir: %v", err)
	}
	// stderr is copied by another goroutine than stdout: the human lines,
	// written just before the JSON object, may arrive a moment later.
	if !strings.HasPrefix(r.WebhookURL, "http://127.0.0.1:") {
		t.Errorf("webhook_url %q, want the echo receiver on loopback", r.WebhookURL)
	}
	for _, want := range []string{"admin", "NATS", "PostgreSQL", "SMTP", "file root", "webhook", r.AdminURL, r.NATSURL, r.SMTPAddr, r.FileRoot, r.WebhookURL} {
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(p.stderr.String(), want) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("stderr lacks %q", want)
		}
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, r.DatabaseURL)
	if err != nil {
		t.Fatalf("connect to the printed database_url: %v", err)
	}
	// Only with the password it prints: another local user connecting as
	// postgres without it is refused.
	if u, err := url.Parse(r.DatabaseURL); err != nil || u.User == nil {
		t.Fatalf("database_url %q has no user", r.DatabaseURL)
	} else if _, ok := u.User.Password(); !ok {
		t.Fatalf("database_url %q has no password", r.DatabaseURL)
	} else {
		u.User = url.User("postgres")
		if c2, err := pgx.Connect(ctx, u.String()); err == nil {
			_ = c2.Close(ctx)
			t.Fatal("connected to dev's PostgreSQL without its password")
		}
	}
	if strings.Contains(p.stderr.String(), "PostgreSQL  "+r.DatabaseURL) {
		t.Error("the PostgreSQL line shows the password (only the export line may)")
	}
	// A second shell gets the schema with the export line.
	if testdb.Schema() != pgschema.Default && !strings.Contains(p.stderr.String(), "GATEWAY_SCHEMA="+testdb.Schema()) {
		t.Errorf("the export line lacks GATEWAY_SCHEMA=%s:\n%s", testdb.Schema(), p.stderr.String())
	}
	intents := waitDemo(t, p, conn)
	checkDemo(t, p, intents, fileRoot)
	_ = conn.Close(ctx)
	if !strings.Contains(p.stderr.String(), "the webhook receiver got 1 request(s)") {
		t.Errorf("stderr does not say the webhook was received once")
	}

	// The admin API shows the same intents.
	resp, err := http.Get(r.AdminURL + "/api/v1/intents?resource=nightly-report")
	if err != nil {
		t.Fatalf("admin server: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "B-report-epoch-") || strings.Contains(string(body), "A-report-epoch-") {
		t.Errorf("admin API: %s %s", resp.Status, body)
	}

	checkDevMetrics(t, r.AdminURL)

	took := p.interrupt(t)
	if took > 30*time.Second {
		t.Errorf("stopping took %s", took)
	}
	if !devProcessGone(r.PostgresPID) {
		t.Errorf("PostgreSQL pid %d still exists after gateway dev exited", r.PostgresPID)
	}
	if _, err := os.Stat(r.DataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary data dir %s not removed: %v", r.DataDir, err)
	}
	for name, addr := range map[string]string{
		"NATS": devNATSAddr(t, r.NATSURL), "SMTP": r.SMTPAddr, "admin": strings.TrimPrefix(r.AdminURL, "http://"),
		"webhook": strings.TrimPrefix(r.WebhookURL, "http://"),
	} {
		if !devPortClosed(addr) {
			t.Errorf("%s port %s still open", name, addr)
		}
	}
}

// TestDevDataDirIsKeptAndReused runs the demo twice on one --data-dir: the
// second run reuses the cluster, so epochs continue where they were.
func TestDevDataDirIsKeptAndReused(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	// As root, PostgreSQL runs as the postgres user, which must be able to
	// pass through the test's temporary directories.
	for d := dataDir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	fileRoot := t.TempDir()
	var epochs []int64
	for run := 1; run <= 2; run++ {
		p := startDev(t, "--demo", "--addr", devFreeAddr(t), "--file-root", fileRoot, "--data-dir", dataDir)
		if !p.ready.DataDirKept || p.ready.DataDir != dataDir {
			t.Fatalf("run %d: ready object %+v", run, p.ready)
		}
		conn, err := pgx.Connect(context.Background(), p.ready.DatabaseURL)
		if err != nil {
			t.Fatal(err)
		}
		// A second shell gets the schema with the export line.
		if testdb.Schema() != pgschema.Default && !strings.Contains(p.stderr.String(), "GATEWAY_SCHEMA="+testdb.Schema()) {
			t.Errorf("the export line lacks GATEWAY_SCHEMA=%s:\n%s", testdb.Schema(), p.stderr.String())
		}
		intents := waitDemo(t, p, conn)
		_ = conn.Close(context.Background())
		epochs = append(epochs, checkDemo(t, p, intents, fileRoot))
		p.interrupt(t)
		if !devProcessGone(p.ready.PostgresPID) {
			t.Errorf("run %d: PostgreSQL pid %d still exists", run, p.ready.PostgresPID)
		}
		if _, err := os.Stat(filepath.Join(dataDir, "postgres", "data", "PG_VERSION")); err != nil {
			t.Fatalf("run %d: the kept cluster is gone: %v", run, err)
		}
	}
	if epochs[0] != 2 || epochs[1] != 4 {
		t.Errorf("B's epochs over two runs = %v, want [2 4] (the kept cluster's epochs continue)", epochs)
	}
}

func TestDevRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--nats-port", "70000"},
		{"--addr", "nonsense"},
		{"--addr", "0.0.0.0:8080"},
		{"--mailpit-url", "ftp://x"},
		{"--nats-port", "4222", "--nats-url", "nats://127.0.0.1:4222"},
		{"--log-level", "loud"},
		{"stray"},
	} {
		var stdout, stderr bytes.Buffer
		a := &app{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
		if code := a.main(context.Background(), append([]string{"dev"}, args...)); code != exitBadInput {
			t.Errorf("dev %v: exit %d, want %d; stderr %s", args, code, exitBadInput, stderr.String())
		}
		var body struct {
			Error struct{ Code, Field string }
		}
		if err := json.Unmarshal(stdout.Bytes(), &body); err != nil || body.Error.Code != "invalid_input" || body.Error.Field == "" {
			t.Errorf("dev %v: stdout %q", args, stdout.String())
		}
	}
}

// An --addr dev cannot listen on is exit 2 naming addr, before anything
// starts; the hint that another gateway dev may be running comes only
// when the address is in use, not for one that names no port.
func TestDevAddrHint(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	const hint = "is another gateway dev running?"
	for _, c := range []struct {
		addr string
		hint bool
	}{
		{taken.Addr().String(), true},
		{"127.0.0.1:18999x", false},
	} {
		var stdout, stderr bytes.Buffer
		a := &app{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
		code := a.main(context.Background(), []string{"dev", "--addr", c.addr})
		var body struct {
			Error struct{ Code, Field, Message string }
		}
		if err := json.Unmarshal(stdout.Bytes(), &body); err != nil || code != exitBadInput || body.Error.Field != "addr" ||
			strings.Contains(body.Error.Message, hint) != c.hint {
			t.Errorf("dev --addr %s: exit %d, %s; want exit 2 naming addr, the hint %v", c.addr, code, stdout.String(), c.hint)
		}
	}
}

// checkDevMetrics scrapes dev's /metrics after the demo: the lease
// counters are there as in gateway run, and they and the stale-epoch
// counter show what the demo did — A's lease taken free, B's taken after
// A's expired, A's late write refused at enqueue and at the file
// destination.
func checkDevMetrics(t *testing.T, adminURL string) {
	t.Helper()
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %s %s", resp.Status, body)
	}
	n := 0
	for _, series := range []string{
		`fencegate_lease_takeovers_total{how="free"}`,
		`fencegate_lease_takeovers_total{how="after_expiry"}`,
		`fencegate_stale_epoch_rejections_total{where="enqueue"}`,
		`fencegate_stale_epoch_rejections_total{where="file_destination"}`,
	} {
		v, ok := metricValue(string(body), series)
		switch {
		case !ok:
			t.Errorf("/metrics lacks %s", series)
		case v < 1:
			t.Errorf("%s = %v after the demo, want at least 1", series, v)
		default:
			n++
		}
	}
	t.Logf("dev's /metrics: %d demo counters checked", n)
}

// metricValue finds series (name{labels} as the text format writes it) in
// a scrape.
func metricValue(scrape, series string) (float64, bool) {
	for _, line := range strings.Split(scrape, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// gateway dev on existing servers (--database-url, --nats-url) shows their
// URLs as its stderr lines do, without the password, in the ready object
// too: it echoed them whole there. What dev starts itself keeps its
// password there (the developer's own, to connect with).
func TestDevReadyHidesAGivenPassword(t *testing.T) {
	t.Parallel()
	db, err := url.Parse(testdb.NewEmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts its local connections: the password is sent
	// to no one, only given.
	db.User = url.UserPassword(db.User.Username(), "dev-PWsecret-db")
	ns, err := url.Parse(natstest.Start(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	ns.User = url.UserPassword("u", "dev-PWsecret-nats")
	p := startDev(t, "--addr", devFreeAddr(t), "--file-root", t.TempDir(), "--schema", testdb.Schema(),
		"--database-url", db.String(), "--nats-url", ns.String())
	r := p.ready
	if strings.Contains(r.DatabaseURL+r.NATSURL, "PWsecret") || !strings.Contains(r.DatabaseURL, db.Host) || !strings.Contains(r.NATSURL, ns.Host) {
		t.Errorf("ready object %+v: want the given URLs without their passwords", r)
	}
	p.interrupt(t)
	if strings.Contains(p.stderr.String(), "PWsecret") {
		t.Errorf("stderr shows a password:\n%s", p.stderr.String())
	}
}
