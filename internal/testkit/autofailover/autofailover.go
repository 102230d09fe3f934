// Package autofailover starts a pg_auto_failover formation from nothing,
// for the failover test (test/failover): a monitor, a primary and a
// synchronous secondary, each a `pg_autoctl run` process on 127.0.0.1
// (Debian's postgresql-15-auto-failover; as root they run as the postgres
// user). A node can be killed with its PostgreSQL (kill -9 of its process
// group), started again (it rejoins as a secondary, rewound by
// pg_auto_failover), and the formation switched over.
//
// The monitor's health checks are tightened (Options.Monitor) so that a
// failover takes seconds, not the defaults' half minute: what the test
// measures is what the gateway adds to the HA manager's promotion.
package autofailover

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// DefaultMonitor are the monitor's settings Start applies unless
// Options.Monitor says otherwise (milliseconds): a primary whose checks
// fail for 3 s is failed over, and the new primary waits 5 s (not 30) for
// the old one to have demoted itself before it takes writes.
var DefaultMonitor = map[string]string{
	"pgautofailover.health_check_period":               "1000",
	"pgautofailover.health_check_timeout":              "1000",
	"pgautofailover.health_check_max_retries":          "1",
	"pgautofailover.health_check_retry_delay":          "500",
	"pgautofailover.node_considered_unhealthy_timeout": "3000",
	"pgautofailover.primary_demote_timeout":            "5000",
}

// Options configures a formation.
type Options struct {
	// Nodes is the number of PostgreSQL nodes. Default 2: a primary and a
	// synchronous secondary.
	Nodes int
	// DB is the database the formation serves. Default "app".
	DB string
	// Monitor are settings of the monitor (ALTER SYSTEM). Nil:
	// DefaultMonitor.
	Monitor map[string]string
	// Log receives every pg_autoctl process's output. Nil: files in the
	// formation's directory.
	Log func(node, line string)
}

// Formation is a running monitor and its nodes.
type Formation struct {
	dir     string
	db      string
	env     []string
	cred    *syscall.Credential
	uid     int
	gid     int
	monitor *Node
	Nodes   []*Node
}

// Node is one pg_autoctl run process and the PostgreSQL it keeps.
type Node struct {
	f      *Formation
	Name   string
	Port   int
	pgdata string
	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	log    *os.File
}

// Start creates and starts a formation, stopped at the test's end.
func Start(t testing.TB, opts Options) *Formation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, err := start(ctx, opts)
	if f != nil {
		t.Cleanup(f.Stop)
	}
	if err != nil {
		t.Fatalf("autofailover: %v", err)
	}
	return f
}

func start(ctx context.Context, opts Options) (*Formation, error) {
	if _, err := exec.LookPath("pg_autoctl"); err != nil {
		return nil, errors.New("pg_autoctl is not installed: run make failover (scripts/failover.sh installs it), or apt-get install postgresql-15-auto-failover")
	}
	bin, err := pgcluster.BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fencegate-autofailover-")
	if err != nil {
		return nil, err
	}
	f := &Formation{dir: dir, db: opts.DB, uid: -1, gid: -1}
	if f.db == "" {
		f.db = "app"
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return f, fmt.Errorf("running as root needs a postgres user: %w", err)
		}
		f.uid, _ = strconv.Atoi(u.Uid)
		f.gid, _ = strconv.Atoi(u.Gid)
		f.cred = &syscall.Credential{Uid: uint32(f.uid), Gid: uint32(f.gid)}
		if err := os.Chown(dir, f.uid, f.gid); err != nil {
			return f, err
		}
	}
	// pg_autoctl keeps its state under XDG directories: the formation's.
	f.env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "HOME="+dir,
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "share"),
		"XDG_RUNTIME_DIR="+filepath.Join(dir, "run"), "PG_AUTOCTL_DEBUG=")
	n := opts.Nodes
	if n <= 0 {
		n = 2
	}
	ports := make([]int, n+1)
	for i := range ports {
		if ports[i], err = toolbin.FreePort(); err != nil {
			return f, err
		}
	}
	f.monitor = &Node{f: f, Name: "monitor", Port: ports[0], pgdata: filepath.Join(dir, "monitor")}
	if err := f.pgautoctl(ctx, "create", "monitor", "--pgdata", f.monitor.pgdata, "--pgport", strconv.Itoa(f.monitor.Port),
		"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl"); err != nil {
		return f, err
	}
	if err := f.monitor.Run(); err != nil {
		return f, err
	}
	for {
		conn, err := f.monitorConn(ctx)
		if err == nil {
			conn.Close(ctx)
			break
		}
		select {
		case <-ctx.Done():
			return f, fmt.Errorf("the monitor does not answer: %w\n%s", err, f.monitor.Log())
		case <-time.After(200 * time.Millisecond):
		}
	}
	settings := opts.Monitor
	if settings == nil {
		settings = DefaultMonitor
	}
	if err := f.monitorSettings(ctx, settings); err != nil {
		return f, err
	}
	for i := 1; i <= n; i++ {
		node := &Node{f: f, Name: fmt.Sprintf("node%d", i), Port: ports[i], pgdata: filepath.Join(dir, fmt.Sprintf("node%d", i))}
		f.Nodes = append(f.Nodes, node)
		// One at a time: the first becomes the primary, the next ones
		// are cloned from it.
		if err := f.pgautoctl(ctx, "create", "postgres", "--pgdata", node.pgdata, "--pgport", strconv.Itoa(node.Port),
			"--hostname", "127.0.0.1", "--name", node.Name, "--auth", "trust", "--no-ssl", "--dbname", f.db,
			"--monitor", f.MonitorURL()); err != nil {
			return f, err
		}
		if err := node.Run(); err != nil {
			return f, err
		}
		// Alone, the first node is "single"; it becomes "primary" when
		// the next one is its secondary.
		want := "single"
		if i > 1 {
			want = "secondary"
		}
		if err := f.WaitState(ctx, map[string]string{node.Name: want}); err != nil {
			return f, err
		}
	}
	return f, f.WaitState(ctx, f.steady())
}

// steady is the state of a healthy formation with its first node primary.
func (f *Formation) steady() map[string]string {
	m := map[string]string{}
	for i, n := range f.Nodes {
		m[n.Name] = "secondary"
		if i == 0 {
			m[n.Name] = "primary"
		}
	}
	return m
}

// pgautoctl runs one pg_autoctl command to its end.
func (f *Formation) pgautoctl(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "pg_autoctl", args...)
	cmd.Env, cmd.Dir = f.env, f.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_autoctl %s: %v\n%s", strings.Join(args, " "), err, lastLines(string(out), 20))
	}
	return nil
}

func (f *Formation) monitorSettings(ctx context.Context, settings map[string]string) error {
	conn, err := f.monitorConn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for k, v := range settings {
		if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET %s = %s", pgx.Identifier{k}.Sanitize(), quote(v))); err != nil {
			return fmt.Errorf("monitor: set %s: %w", k, err)
		}
	}
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	return err
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// MonitorURL is the monitor's URL, as the nodes reach it.
func (f *Formation) MonitorURL() string {
	return fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.monitor.Port)
}

func (f *Formation) monitorConn(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return pgx.Connect(cctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.monitor.Port))
}

// URL is the formation's multi-host URL of its database, as user postgres:
// every node, and target_session_attrs=read-write, so that a client
// connects to whichever is the primary.
func (f *Formation) URL() string {
	var hosts []string
	for _, n := range f.Nodes {
		hosts = append(hosts, "127.0.0.1:"+strconv.Itoa(n.Port))
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		strings.Join(hosts, ","), url.PathEscape(f.db))
}

// URL is the node's own URL of the formation's database.
func (n *Node) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2", n.Port, url.PathEscape(n.f.db))
}

// State returns every node's state as the monitor has it: name →
// reported state (primary, secondary, wait_primary, demoted, …), with the
// assigned one after a '/' when they differ.
func (f *Formation) State(ctx context.Context) (map[string]string, error) {
	conn, err := f.monitorConn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node ORDER BY nodeid`)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for rows.Next() {
		var name, reported, goal string
		if err := rows.Scan(&name, &reported, &goal); err != nil {
			return nil, err
		}
		m[name] = reported
		if goal != reported {
			m[name] += "/" + goal
		}
	}
	return m, rows.Err()
}

// WaitState waits until every node named in want reports (and is
// assigned) the state given.
func (f *Formation) WaitState(ctx context.Context, want map[string]string) error {
	var last map[string]string
	var lastErr error
	for {
		last, lastErr = f.State(ctx)
		if lastErr == nil {
			ok := true
			for k, v := range want {
				ok = ok && last[k] == v
			}
			if ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %v: %w (last %v, %v)", want, ctx.Err(), last, lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Primary returns the node the monitor has as primary (or wait_primary:
// a primary without its secondary), nil when none.
func (f *Formation) Primary(ctx context.Context) (*Node, error) {
	st, err := f.State(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range f.Nodes {
		switch st[n.Name] {
		case "primary", "wait_primary", "single":
			return n, nil
		}
	}
	return nil, nil
}

// Switchover asks the monitor for a planned switchover: the primary is
// demoted cleanly and the secondary promoted. It returns when the command
// has finished.
func (f *Formation) Switchover(ctx context.Context) error {
	return f.pgautoctl(ctx, "perform", "switchover", "--monitor", f.MonitorURL())
}

// Run starts the node's pg_autoctl run (its keeper, which starts its
// PostgreSQL), in a process group of its own.
func (n *Node) Run() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		select {
		case <-n.done:
		default:
			return fmt.Errorf("%s runs already", n.Name)
		}
	}
	if n.log == nil {
		l, err := os.OpenFile(filepath.Join(n.f.dir, n.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		n.log = l
	}
	cmd := exec.Command("pg_autoctl", "run", "--pgdata", n.pgdata)
	cmd.Env, cmd.Dir = n.f.env, n.f.dir
	cmd.Stdout, cmd.Stderr = n.log, n.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: n.f.cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", n.Name, err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	done := n.done
	go func() { _ = cmd.Wait(); close(done) }()
	return nil
}

// Kill kills the node with its PostgreSQL at once: SIGKILL to its
// process group (the keeper, its services and the postmaster); the
// postmaster's backends exit when they see it gone.
func (n *Node) Kill() {
	n.signal(syscall.SIGKILL)
}

// Stop stops the node cleanly (SIGTERM: pg_autoctl stops PostgreSQL with
// a fast shutdown), then kills what is left after 30 s.
func (n *Node) Stop() {
	n.signal(syscall.SIGTERM)
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		n.signal(syscall.SIGKILL)
	}
}

func (n *Node) signal(sig syscall.Signal) {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	if sig == syscall.SIGKILL {
		<-done
		// The postmaster's children outlive it for a moment: wait for the
		// port to close.
		deadline := time.Now().Add(10 * time.Second)
		for toolbin.Answers("127.0.0.1:"+strconv.Itoa(n.Port), 100*time.Millisecond) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Log returns what the node's pg_autoctl processes wrote (its tail).
func (n *Node) Log() string {
	b, _ := os.ReadFile(filepath.Join(n.f.dir, n.Name+".log"))
	return lastLines(string(b), 40)
}

// Stop stops every node, the monitor last, and removes the formation.
func (f *Formation) Stop() {
	for _, n := range f.Nodes {
		n.Stop()
	}
	if f.monitor != nil {
		f.monitor.Stop()
	}
	for _, n := range append([]*Node{f.monitor}, f.Nodes...) {
		if n != nil && n.log != nil {
			n.log.Close()
		}
	}
	if os.Getenv("FENCEGATE_FAILOVER_KEEP") == "" {
		os.RemoveAll(f.dir)
	}
}

// Dir is the formation's directory (its nodes' logs are there).
func (f *Formation) Dir() string { return f.dir }

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
