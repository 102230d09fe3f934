package bench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// counted is a pgx tracer counting the requests a connection sends that
// wait for an answer: queries, batches, prepares.
type counted struct{ n atomic.Int64 }

func (c *counted) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *counted) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *counted) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *counted) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *counted) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (c *counted) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *counted) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// The round trips the budget counts from the kernel (data segments sent
// per TCP connection, tcp_info) are the requests the client sent: 20
// single queries, a pipelined batch of 5 as one, and a transaction's
// BEGIN, 3 statements and COMMIT, 26 with pgx's one-round-trip mode (no
// statement prepared ahead), as its tracer counts them too.
func TestTCPRequestsAreRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := testdb.Server(t)
	port := pgTCPPort(url)
	if port == 0 {
		t.Fatalf("test server %s is not reached over TCP", url)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	tr := &counted{}
	cfg.Tracer = tr
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	before, err := tcpRequests(port)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	start, err := tcpRequests(port)
	if err != nil {
		t.Fatal(err)
	}
	_, conns := newRequests(before, start)
	if conns != 1 {
		t.Fatalf("%d new connections to port %d seen; want the test's one", conns, port)
	}
	tr.n.Store(0)

	for i := range 20 {
		var v int
		if err := conn.QueryRow(ctx, "SELECT $1::int + 1", i).Scan(&v); err != nil || v != i+1 {
			t.Fatalf("query: %v %d", err, v)
		}
	}
	b := &pgx.Batch{}
	for i := range 5 {
		b.Queue("SELECT $1::int", i)
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for range 3 {
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	end, err := tcpRequests(port)
	if err != nil {
		t.Fatal(err)
	}
	var sent int64
	for inode, segs := range end {
		if s0, ok := start[inode]; ok {
			if _, old := before[inode]; !old {
				sent += int64(segs - s0)
			}
		}
	}
	want := tr.n.Load()
	t.Logf("requests: %d counted by the kernel, %d by the tracer", sent, want)
	if sent != 26 || want != 26 {
		t.Fatalf("kernel counted %d requests, tracer %d; want 26 both", sent, want)
	}
}

// The server's CPU is the postmaster's tree: this process's own tree here
// (a test has no server it started), which has spent some CPU.
func TestProcessTreeTicks(t *testing.T) {
	t.Parallel()
	for i := 0; processTreeTicks(os.Getpid()) == 0 && i < 1e9; i++ {
		_ = strings.Repeat("x", i%100)
	}
	if got := processTreeTicks(os.Getpid()); got <= 0 {
		t.Fatalf("processTreeTicks(self) = %d; want > 0", got)
	}
	if got := processTreeTicks(1 << 30); got != -1 {
		t.Fatalf("processTreeTicks(no such process) = %d; want -1", got)
	}
}

func TestLSNDiff(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want int64
	}{{"0/16B3748", "0/16B3740", 8}, {"1/0", "0/FFFFFFFF", 1}, {"2/10", "2/10", 0}} {
		if got, err := lsnDiff(c.a, c.b); err != nil || got != c.want {
			t.Errorf("lsnDiff(%s, %s) = %d, %v; want %d", c.a, c.b, got, err, c.want)
		}
	}
	if _, err := lsnDiff("nope", "0/0"); err == nil {
		t.Error("a bad LSN was accepted")
	}
}

// A given server's postmaster is the parent of its backend only when that
// parent works in the server's data directory: here the "backend" is this
// test process, its parent the go command (or a shell), whose working
// directory stands in for the data directory.
func TestPostmasterOf(t *testing.T) {
	t.Parallel()
	parent := os.Getppid()
	cwd, err := os.Readlink("/proc/" + strconv.Itoa(parent) + "/cwd")
	if err != nil {
		t.Fatalf("read the parent's working directory: %v", err)
	}
	if pid, why := postmasterOf(os.Getpid(), cwd); pid != parent || why != "" {
		t.Fatalf("postmasterOf(self, parent's cwd) = %d, %q; want %d", pid, why, parent)
	}
	if pid, why := postmasterOf(os.Getpid(), filepath.Join(cwd, "not-the-data-directory")); pid != 0 || !strings.Contains(why, "not on this machine") {
		t.Fatalf("postmasterOf(self, another directory) = %d, %q; want refused", pid, why)
	}
	if pid, why := postmasterOf(1<<30, cwd); pid != 0 || !strings.Contains(why, "not in /proc") {
		t.Fatalf("postmasterOf(no such backend) = %d, %q; want refused", pid, why)
	}
}

// The test server's postmaster is found from a connection to it when it
// runs here: the pid testenv started it with. (A server given to the test
// command from elsewhere: found, or refused with a reason.) Not parallel:
// its connection would be one more to the server's port while
// TestTCPRequestsAreRoundTrips counts this process's (the parallel tests
// start after it has ended).
func TestLocalPostmaster(t *testing.T) {
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, testdb.Server(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	pid, why := localPostmaster(ctx, conn)
	want, _ := strconv.Atoi(os.Getenv("GATEWAY_TEST_POSTMASTER_PID"))
	switch {
	case want > 0 && (pid != want || why != ""):
		t.Fatalf("localPostmaster = %d, %q; want testenv's postmaster %d", pid, why, want)
	case want == 0 && (pid > 0) == (why != ""):
		t.Fatalf("localPostmaster = %d, %q; want a pid or a reason", pid, why)
	}
	if pid > 0 && processTreeTicks(pid) < 0 {
		t.Fatalf("processTreeTicks(%d) < 0 for the server's postmaster", pid)
	}
	t.Logf("postmaster %d (testenv's: %d) %s", pid, want, why)
}
