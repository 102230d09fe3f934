// Package pgcluster starts and stops throwaway PostgreSQL clusters from the
// machine's PostgreSQL binaries, for tests, `gateway dev` and the test
// command. When the current user is root the cluster runs as the `postgres`
// user, because initdb refuses to run as root.
//
// The server is a direct child of this process (no pg_ctl daemon), started
// with a parent-death signal, so a test binary that dies takes its server
// with it, and Stop, Kill and Restart act on a known process id.
package pgcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// Options configures a cluster.
type Options struct {
	// Dir is the directory that holds the data directory and the socket.
	// Empty: a new temporary directory, removed by Stop.
	Dir string
	// Port to listen on at 127.0.0.1. Zero: a free port.
	Port int
	// Durable keeps fsync on. Tests run with fsync off for speed; a clean
	// shutdown or a process kill still loses nothing (only an OS crash would).
	Durable bool
	// Settings are extra `-c name=value` server settings.
	Settings map[string]string
	// Log receives the server's output. Nil: a file server.log in Dir.
	Log *os.File
	// PasswordAuth makes TCP connections need a password (scram-sha-256),
	// generated at initdb and kept in Dir (mode 0600) for the next Start
	// on the same Dir; URL includes it. The Unix socket, in Dir (0700),
	// stays trust: only Dir's owner reaches it. Off: trust, for tests.
	PasswordAuth bool
}

// AsyncCommit returns the Settings of a server that acknowledges commits
// before their WAL is flushed: synchronous_commit=off and a WAL writer that
// flushes only every 10 s. Nothing else flushes WAL behind a test's back:
// no autovacuum, no background writer, no timed checkpoint. With Durable
// and StopImmediate it loses every acknowledged commit that was not made
// durable some other way, which is what a durability test needs to see.
func AsyncCommit() map[string]string {
	return map[string]string{
		"synchronous_commit":    "off",
		"wal_writer_delay":      "10000ms",
		"autovacuum":            "off",
		"bgwriter_lru_maxpages": "0",
		"checkpoint_timeout":    "1h",
	}
}

// passwordFile holds the generated password, in the cluster's Dir.
const passwordFile = "postgres.password"

// Cluster is a running (or stopped) throwaway PostgreSQL cluster.
type Cluster struct {
	opts     Options
	dir      string
	dataDir  string
	ownDir   bool
	port     int
	bin      string
	password string // "" with trust authentication
	cred     *syscall.Credential
	uid, gid int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// BinDir finds the directory holding the PostgreSQL server binaries.
func BinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Strings(matches)
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("pgcluster: PostgreSQL server binaries (initdb, postgres) not found; install PostgreSQL or set PG_BINDIR")
}

// Start initialises (when needed) and starts a cluster.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, bin: bin, uid: -1, gid: -1}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: running as root needs a postgres user for initdb: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.uid, c.gid = uid, gid
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	c.dir = opts.Dir
	if c.dir == "" {
		c.dir, err = os.MkdirTemp("", "fencegate-pg-")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		c.ownDir = true
	} else if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil {
		if err := os.Chown(c.dir, c.uid, c.gid); err != nil {
			return nil, fmt.Errorf("pgcluster: chown %s: %w", c.dir, err)
		}
	}
	c.dataDir = filepath.Join(c.dir, "data")
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); err != nil {
		if err := c.initdb(ctx); err != nil {
			c.cleanup()
			return nil, err
		}
	} else if b, err := os.ReadFile(filepath.Join(c.dir, passwordFile)); err == nil {
		// A kept cluster made with PasswordAuth: its password.
		c.password = strings.TrimSpace(string(b))
	}
	return c.serve(ctx, opts.Port)
}

// serve starts the server of a cluster just set up on port (0: a free
// one) and returns it; on failure it removes the cluster's own directory.
func (c *Cluster) serve(ctx context.Context, port int) (*Cluster, error) {
	c.port = port
	var err error
	if c.port == 0 {
		if c.port, err = toolbin.FreePort(); err != nil {
			err = fmt.Errorf("pgcluster: %w", err)
		}
	}
	if err == nil {
		err = c.start(ctx)
	}
	if err != nil {
		c.cleanup()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) initdb(ctx context.Context) error {
	args := []string{"-D", c.dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"}
	if c.opts.PasswordAuth {
		b := make([]byte, 18)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		c.password = hex.EncodeToString(b)
		pw := filepath.Join(c.dir, passwordFile)
		if err := os.WriteFile(pw, []byte(c.password+"\n"), 0o600); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		if c.cred != nil {
			if err := os.Chown(pw, c.uid, c.gid); err != nil {
				return fmt.Errorf("pgcluster: %w", err)
			}
		}
		// TCP needs the password; the socket in the private directory
		// stays trust.
		args = append(args, "--auth-host=scram-sha-256", "--auth-local=trust", "--pwfile="+pw)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "initdb"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: initdb: %w: %s", err, lastLines(string(out), 5))
	}
	return nil
}

// start runs postgres as a child process and waits until it accepts
// connections.
func (c *Cluster) start(ctx context.Context) error {
	args := []string{
		"-D", c.dataDir,
		"-p", strconv.Itoa(c.port),
		"-k", c.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=300",
		"-c", "shared_buffers=128MB",
		"-c", "log_min_messages=warning",
		"-c", "log_min_error_statement=panic",
		// Commit timestamps let history checkers order transactions by
		// commit (see outbox's race test).
		"-c", "track_commit_timestamp=on",
	}
	if !c.opts.Durable {
		args = append(args, "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=on")
	}
	keys := make([]string, 0, len(c.opts.Settings))
	for k := range c.opts.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+c.opts.Settings[k])
	}
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), args...)
	// Pdeathsig is applied after the credential change, so the server still
	// dies with us when it runs as another user.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	cmd.Dir = c.dir
	logf := c.opts.Log
	if logf == nil {
		f, err := os.OpenFile(filepath.Join(c.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		logf = f
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-done:
			if pids := c.leftovers(); len(pids) > 0 {
				return fmt.Errorf("pgcluster: postgres exited during start (processes %v still run in its data directory): %s", pids, c.tailLog())
			}
			return fmt.Errorf("pgcluster: postgres exited during start: %s", c.tailLog())
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, c.URL("postgres"))
		cancel()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = c.Kill()
			return fmt.Errorf("pgcluster: postgres did not accept connections: %v; %s", err, c.tailLog())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) tailLog() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
	return lastLines(string(b), 10)
}

// URL returns a connection URL for database db on this cluster.
func (c *Cluster) URL(db string) string {
	if c.password != "" {
		return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/%s?sslmode=disable", c.password, c.port, db)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// Port returns the TCP port the cluster listens on.
func (c *Cluster) Port() int { return c.port }

// PID returns the postmaster's process id, or 0 when stopped.
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

func (c *Cluster) signalAndWait(sig syscall.Signal, timeout time.Duration) error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if sig == syscall.SIGKILL {
		return c.killServer(cmd.Process, done)
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(timeout):
		return c.killServer(cmd.Process, done)
	}
	// The postmaster exits only after its children on a shutdown, so this
	// finds none unless one was orphaned; it would hold the shared memory
	// block and the next start would refuse to run.
	return c.killServer(nil, done)
}

// Shutdown stops the server with a fast shutdown (SIGINT), keeping the data.
func (c *Cluster) Shutdown() error { return c.signalAndWait(syscall.SIGINT, 30*time.Second) }

// Kill stops the server with SIGKILL, as in a crash; the next start recovers.
// It returns once no process of the server is left (see killServer), so
// StartAgain can run at once.
func (c *Cluster) Kill() error { return c.signalAndWait(syscall.SIGKILL, 10*time.Second) }

// StopImmediate stops the server as `pg_ctl stop -m immediate` does
// (SIGQUIT): no checkpoint, no flush of WAL still in memory, as in a crash;
// the next start recovers.
func (c *Cluster) StopImmediate() error { return c.signalAndWait(syscall.SIGQUIT, 10*time.Second) }

// Restart shuts the server down and starts it again on the same port.
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.Shutdown(); err != nil {
		return err
	}
	return c.start(ctx)
}

// StartAgain starts a cluster that was shut down or killed, on the same port.
func (c *Cluster) StartAgain(ctx context.Context) error { return c.start(ctx) }

// Stop shuts the server down and removes its directory if Start created it.
func (c *Cluster) Stop() error {
	err := c.Shutdown()
	c.cleanup()
	return err
}

func (c *Cluster) cleanup() {
	if c.ownDir {
		_ = os.RemoveAll(c.dir)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
