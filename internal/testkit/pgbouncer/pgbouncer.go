// Package pgbouncer starts a real PgBouncer (Debian's pgbouncer, found as
// $PGBOUNCER_BIN, on $PATH or in /usr/sbin) in transaction-pooling mode in
// front of a test's PostgreSQL server, for the tests that show the gateway,
// its clients and the CLI working through it. The test command installs
// the package when it is missing (scripts/tools.sh, setup_pgbouncer); a
// test without it fails, saying how to get it, and never skips.
//
// The bouncer runs with few server connections per database and user
// (Options.PoolSize, default 4), so that client connections share server
// connections all the time: anything that relies on session state across
// transactions (a server-side prepared statement, LISTEN, a session SET, a
// session advisory lock) breaks through it the way it does in production.
package pgbouncer

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// EnvBin names the environment variable with the pgbouncer binary's path.
const EnvBin = "PGBOUNCER_BIN"

// Options configures a bouncer.
type Options struct {
	// PoolSize is default_pool_size: server connections per database and
	// user pair. Default 4.
	PoolSize int
	// Users may connect through the bouncer besides the upstream URL's
	// user (auth_type trust still wants them in its auth_file).
	Users []string
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	port int
	proc *toolbin.Process
	dir  string
}

// Bin finds the pgbouncer binary: $PGBOUNCER_BIN, pgbouncer on $PATH, or
// /usr/sbin/pgbouncer (Debian's package puts it there, outside a
// non-root user's $PATH).
func Bin() (string, error) {
	if p := os.Getenv(EnvBin); p != "" {
		if !toolbin.IsExecutable(p) {
			return "", fmt.Errorf("%s=%q is not an executable file", EnvBin, p)
		}
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if toolbin.IsExecutable("/usr/sbin/pgbouncer") {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("pgbouncer is not installed: run the test command (scripts/test.sh installs it), or apt-get install pgbouncer, or set %s", EnvBin)
}

// Start starts a bouncer in transaction mode in front of the server of
// upstream (a postgres:// URL; every database of that server is reachable
// through the bouncer under its own name) and stops it at the test's end.
func Start(t testing.TB, upstream string, opts Options) *Bouncer {
	t.Helper()
	b, err := start(upstream, opts)
	if err != nil {
		t.Fatalf("pgbouncer: %v", err)
	}
	t.Cleanup(b.Stop)
	return b
}

func start(upstream string, opts Options) (*Bouncer, error) {
	bin, err := Bin()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(upstream)
	if err != nil || u.Hostname() == "" {
		return nil, fmt.Errorf("upstream is not a postgres:// URL with a host")
	}
	upPort := u.Port()
	if upPort == "" {
		upPort = "5432"
	}
	users := append([]string{u.User.Username()}, opts.Users...)
	poolSize := opts.PoolSize
	if poolSize <= 0 {
		poolSize = 4
	}
	dir, err := os.MkdirTemp("", "fencegate-pgbouncer-")
	if err != nil {
		return nil, err
	}
	// PgBouncer refuses to run as root: as root it is told to switch to
	// the postgres user (the one pgcluster runs the server as), which owns
	// its directory.
	var args []string
	if os.Geteuid() == 0 {
		pu, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs a postgres user to run pgbouncer as: %w", err)
		}
		uid, _ := strconv.Atoi(pu.Uid)
		gid, _ := strconv.Atoi(pu.Gid)
		args = append(args, "-u", "postgres")
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	var userlist strings.Builder
	for _, name := range users {
		if name != "" {
			fmt.Fprintf(&userlist, "%q \"\"\n", name)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(userlist.String()), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// A free port can be taken by another process before pgbouncer binds
	// it: a few tries.
	var lastErr error
	for range 5 {
		port, err := toolbin.FreePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 2000
max_db_connections = 0
server_lifetime = 3600
server_idle_timeout = 60
query_wait_timeout = 60
ignore_startup_parameters = extra_float_digits
pidfile = %s
logfile =
log_connections = 0
log_disconnections = 0
`, u.Hostname(), upPort, port, filepath.Join(dir, "userlist.txt"), poolSize, filepath.Join(dir, "pgbouncer.pid"))
		iniPath := filepath.Join(dir, "pgbouncer.ini")
		if err := os.WriteFile(iniPath, []byte(ini), 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		cmd := exec.Command(bin, append(args, iniPath)...)
		cmd.Dir = dir
		proc, err := toolbin.Start(cmd)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		b := &Bouncer{port: port, proc: proc, dir: dir}
		if err := proc.WaitReady("pgbouncer", 10*time.Second, func() bool { return b.answers() }); err != nil {
			proc.Stop()
			lastErr = fmt.Errorf("%w: %s", err, strings.TrimSpace(proc.Output.String()))
			continue
		}
		return b, nil
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// answers reports whether the bouncer accepts connections.
func (b *Bouncer) answers() bool {
	return toolbin.Answers(net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)), 200*time.Millisecond)
}

// Port is the port the bouncer listens on at 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// URL returns direct (a postgres:// URL of the upstream server) with its
// host and port replaced by the bouncer's: the same database and user,
// through the bouncer.
func (b *Bouncer) URL(direct string) string {
	u, err := url.Parse(direct)
	if err != nil {
		return direct
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
	return u.String()
}

// Stop stops the bouncer and removes its directory.
func (b *Bouncer) Stop() {
	b.proc.Stop()
	os.RemoveAll(b.dir)
}
