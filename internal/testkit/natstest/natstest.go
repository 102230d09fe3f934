// Package natstest gives tests a real NATS JetStream server: an embedded one
// (Start), cheap enough for one per test, a real nats-server process
// (StartProcess) for tests that kill it and start it again on the same port
// and store directory, and a JetStream cluster of such processes
// (StartCluster, cluster.go) whose nodes can be killed, restarted, paused
// and resumed.
//
// The process is built once per test binary from the nats-server module in
// go.mod (`go build github.com/nats-io/nats-server/v2`), so it works offline;
// $NATS_SERVER_BIN names a prebuilt binary instead. Call Cleanup from
// TestMain to remove the built binary.
package natstest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// EnvBin names an environment variable with a prebuilt nats-server binary.
const EnvBin = "NATS_SERVER_BIN"

// Server is an embedded JetStream server, shut down at the test's end.
type Server struct {
	// URL is the client URL, nats://127.0.0.1:PORT.
	URL string
	srv *server.Server
}

// Start starts an embedded JetStream server on a random 127.0.0.1 port with
// its store in t.TempDir(), shut down when the test ends.
func Start(t testing.TB) *Server { return StartWith(t, nil) }

// StartWith is Start with the server's options changed by mod (TLS,
// authentication) before it starts.
func StartWith(t testing.TB, mod func(*server.Options)) *Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
	if mod != nil {
		mod(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatalf("natstest: embedded server not ready in 10s")
	}
	s := &Server{URL: srv.ClientURL(), srv: srv}
	t.Cleanup(s.Shutdown)
	return s
}

// Shutdown stops the server and waits until it has stopped. Idempotent.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}

// Connect returns a connection to url closed at the test's end.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

// Binary returns the path of a nats-server binary: $NATS_SERVER_BIN, or one
// built once per test binary from the module in go.mod.
func Binary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv(EnvBin); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "natstest-bin-")
		if buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "nats-server")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", buildBin, "github.com/nats-io/nats-server/v2")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("natstest: %v (set %s to use a prebuilt binary)", buildErr, EnvBin)
	}
	return buildBin
}

// Cleanup removes the binary Binary built, if any. Call it from TestMain
// after m.Run.
func Cleanup() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := toolbin.FreePort()
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return port
}

// startTimeout bounds a process's start until it serves JetStream: generous,
// because a cluster node serves it only once it has joined the meta group
// (an election after a restart), and CI runs every package's tests at once
// on 2 cores.
const startTimeout = 90 * time.Second

// Process is a nats-server process with JetStream, on a fixed port and store
// directory that survive Kill and Restart.
type Process struct {
	// URL is the client URL, nats://127.0.0.1:PORT.
	URL      string
	Port     int
	StoreDir string

	t   testing.TB
	bin string
	// args are the command line after the client port and store options
	// (a cluster node's name, routes and monitoring port).
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	// paused: stopped with SIGSTOP and not continued yet.
	paused bool
	// exited is closed when the current process has been waited for.
	exited <-chan struct{}
	// log is the end of the current process's stderr, said when it exits
	// during start-up.
	log *tailBuffer
}

// StartProcess starts a nats-server process with JetStream on a free port,
// its store in t.TempDir(); it is killed when the test ends.
func StartProcess(t testing.TB) *Process {
	t.Helper()
	p := &Process{t: t, bin: Binary(t), Port: FreePort(t), StoreDir: t.TempDir()}
	p.URL = "nats://127.0.0.1:" + strconv.Itoa(p.Port)
	t.Cleanup(func() { p.Kill() })
	p.Restart()
	return p
}

// Restart starts the process again, on the same port and store directory,
// and waits until it serves JetStream. The process must not be running.
func (p *Process) Restart() {
	p.t.Helper()
	exited := p.start()
	if err := p.waitJetStream(exited, startTimeout); err != nil {
		p.Kill()
		p.t.Fatalf("natstest: nats-server on port %d: %v", p.Port, err)
	}
}

// start starts the process and returns the channel closed when it exits,
// without waiting for it to serve.
func (p *Process) start() <-chan struct{} {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.t.Fatalf("natstest: nats-server pid %d is still running", p.cmd.Process.Pid)
	}
	args := append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-js", "-sd", p.StoreDir}, p.args...)
	cmd := exec.Command(p.bin, args...)
	log := &tailBuffer{max: 4096}
	cmd.Stdout, cmd.Stderr = log, log
	// Dies with the test binary, even when the test's cleanup never runs.
	proc, err := toolbin.Start(cmd)
	if err != nil {
		p.t.Fatalf("natstest: start nats-server: %v", err)
	}
	p.cmd, p.exited, p.paused, p.log = cmd, proc.Exited(), false, log
	return p.exited
}

// Kill stops the process with SIGKILL, by pid, and waits for it to exit.
// It does nothing when the process is not running. A paused process is
// killed too (SIGKILL needs no SIGCONT).
func (p *Process) Kill() { p.signal(syscall.SIGKILL) }

// Stop stops the process with SIGTERM (a clean shutdown) and waits.
func (p *Process) Stop() { p.signal(syscall.SIGTERM) }

// Pause stops the process with SIGSTOP: it keeps its sockets open and
// answers nothing (a hung machine, a long GC or VM pause) until Resume.
func (p *Process) Pause() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		p.t.Fatalf("natstest: pause: nats-server on port %d is not running", p.Port)
	}
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		p.t.Fatalf("natstest: pause nats-server pid %d: %v", p.cmd.Process.Pid, err)
	}
	p.paused = true
}

// Resume continues a paused process with SIGCONT.
func (p *Process) Resume() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		p.t.Fatalf("natstest: resume: nats-server on port %d is not running", p.Port)
	}
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		p.t.Fatalf("natstest: resume nats-server pid %d: %v", p.cmd.Process.Pid, err)
	}
	p.paused = false
}

// Running reports whether the process is running (paused or not).
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// Paused reports whether the process is paused.
func (p *Process) Paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && p.paused
}

func (p *Process) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	if p.paused && sig != syscall.SIGKILL {
		// A stopped process handles no other signal before it continues.
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
	}
	toolbin.WaitOrKill(p.cmd.Process, p.exited, 20*time.Second)
	p.cmd, p.paused = nil, false
}

// errExited: the process exited before it served JetStream.
var errExited = errors.New("exited during start-up")

// waitJetStream polls until a client can reach JetStream at the process's
// URL. An exit meanwhile is errExited, with the end of what the process
// logged (why: a port in use, a bad option).
func (p *Process) waitJetStream(exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("%w; its log ends:\n%s", errExited, p.logTail())
		default:
		}
		nc, err := nats.Connect(p.URL, nats.Timeout(time.Second), nats.NoReconnect())
		if err == nil {
			js, jerr := nc.JetStream()
			if jerr == nil {
				_, jerr = js.AccountInfo(nats.MaxWait(2 * time.Second))
			}
			nc.Close()
			if jerr == nil {
				return nil
			}
			err = jerr
		}
		last = err
		time.Sleep(50 * time.Millisecond) // between polls
	}
	return fmt.Errorf("not ready in %s: %v", timeout, last)
}

// logTail returns the end of what the current (or last) process wrote to
// stderr.
func (p *Process) logTail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.log == nil {
		return ""
	}
	return p.log.String()
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	if over := len(b.b) - b.max; over > 0 {
		b.b = append(b.b[:0], b.b[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}
