// Package faulttest runs fencegate as real processes for fault tests: a
// gateway binary built with -tags failpoints, CLI invocations, `gateway
// run` daemons that can be paused, continued, killed and restarted, and
// deadline-bound polling.
package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/failpoint"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	binPath   string
)

// moduleRoot finds the directory holding go.mod: the nearest one above
// this source file, wherever the package sits in the tree.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Dir(file)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			// No go.mod above: the build that follows fails, naming the
			// directory it ran in.
			return filepath.Dir(file)
		}
		dir = parent
	}
}

// BuildGateway builds (once per test binary) the gateway with -tags
// failpoints and returns its path. GATEWAY_FAILPOINTS_BIN overrides it.
func BuildGateway() (string, error) {
	if p := os.Getenv("GATEWAY_FAILPOINTS_BIN"); p != "" {
		return p, nil
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "faulttest-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(buildDir, "gateway")
		buildErr = GoBuild(binPath, "./cmd/gateway", "failpoints")
	})
	return binPath, buildErr
}

// GoBuild builds the package pkg (relative to the module root) into out,
// with the given build tags (empty: none).
func GoBuild(out, pkg, tags string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := []string{"build", "-o", out}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...)
	cmd.Dir = moduleRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// Cleanup removes the binary BuildGateway built. Call it from TestMain.
func Cleanup() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

// Main is TestMain for a package of fault tests: it runs the tests
// (testdb.Run: a throwaway PostgreSQL is stopped after them), removes the
// binaries built for them (nats-server, the failpoints gateway) and exits
// with the tests' code.
func Main(m *testing.M) {
	code := testdb.Run(m)
	natstest.Cleanup()
	Cleanup()
	os.Exit(code)
}

// Gateway returns the failpoints gateway binary, failing the test when it
// cannot be built.
func Gateway(t testing.TB) string {
	t.Helper()
	p, err := BuildGateway()
	if err != nil {
		t.Fatalf("faulttest: %v", err)
	}
	return p
}

// Result is one finished CLI invocation.
type Result struct {
	Code   int
	Stdout string
	Stderr string
	// Obj is stdout parsed as a JSON object (nil when it is not one).
	Obj map[string]any
	// Killed reports that the process died of SIGKILL (a crash failpoint).
	Killed bool
}

// Int returns Obj[key] as an int64 (JSON numbers), or -1.
func (r Result) Int(key string) int64 {
	if f, ok := r.Obj[key].(float64); ok {
		return int64(f)
	}
	return -1
}

// ErrCode returns the error code of a failed invocation's JSON, or "".
func (r Result) ErrCode() string {
	if e, ok := r.Obj["error"].(map[string]any); ok {
		s, _ := e["code"].(string)
		return s
	}
	return ""
}

// Proc is a started gateway process.
type Proc struct {
	// Cmd is the process; Cmd.Process.Pid its id.
	Cmd    *exec.Cmd
	stdout SyncBuffer
	stderr SyncBuffer
	done   chan struct{}
	err    error
	// release is the process's failpoint release directory
	// (failpoint.EnvReleaseDir): Resume writes its release file there.
	release string
}

// Start starts the gateway binary with args, GATEWAY_DATABASE_URL=dbURL and
// the extra environment env ("K=V"). The process is SIGKILLed (after a
// SIGCONT) when the test ends, if still running.
func Start(t testing.TB, bin, dbURL string, env []string, args ...string) *Proc {
	t.Helper()
	p, err := StartProc(bin, append([]string{"GATEWAY_DATABASE_URL=" + dbURL}, env...), args...)
	if err != nil {
		t.Fatalf("faulttest: %v", err)
	}
	t.Cleanup(p.Kill)
	return p
}

// StartProc starts bin with args and the extra environment env.
func StartProc(bin string, env []string, args ...string) (*Proc, error) {
	release, err := os.MkdirTemp("", "faulttest-release-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), failpoint.EnvReleaseDir+"="+release), env...)
	p := &Proc{Cmd: cmd, done: make(chan struct{}), release: release}
	cmd.Stdout, cmd.Stderr = &p.stdout, &p.stderr
	// Own process group: a signal to the test's group does not reach it,
	// and it dies with its parent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %v: %w", bin, args, err)
	}
	go func() { p.err = cmd.Wait(); _ = os.RemoveAll(release); close(p.done) }()
	return p, nil
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process (nothing when it has exited).
func (p *Proc) Signal(sig syscall.Signal) {
	if !p.Exited() {
		_ = p.Cmd.Process.Signal(sig)
	}
}

// Resume ends a pause failpoint: it releases the pause (a SIGCONT alone
// would not: failpoint.EnvReleaseDir) and continues the process. The
// SIGCONT is repeated while the process is still stopped: one that
// arrives while the process runs (woken meanwhile, looking for its
// release before it had been written) is lost, and the process stops
// again.
func (p *Proc) Resume() {
	if p.Exited() {
		return
	}
	if err := os.WriteFile(failpoint.ReleaseFile(p.release, p.Pid()), nil, 0o600); err != nil {
		panic(fmt.Sprintf("faulttest: release the pause: %v", err))
	}
	running := 0
	for deadline := time.Now().Add(30 * time.Second); running < 3 && time.Now().Before(deadline) && !p.Exited(); {
		st, err := failpoint.ProcState(p.Pid())
		switch {
		case err != nil:
			return
		case st == 'T' || st == 't':
			running = 0
			p.Signal(syscall.SIGCONT)
		default:
			running++
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill SIGKILLs the process (continuing it first, so a stopped process
// dies at once) and waits for it.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGCONT)
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// WaitStopped waits until the process stopped itself (a pause failpoint)
// or was stopped.
func (p *Proc) WaitStopped(timeout time.Duration) error {
	if err := failpoint.WaitStopped(p.Pid(), timeout); err != nil {
		// Say what the process said: why it ended instead of pausing.
		if r, werr := p.Wait(5 * time.Second); werr == nil {
			return fmt.Errorf("%w (exit %d); stdout %s; stderr:\n%s", err, r.Code, tail(r.Stdout), tail(r.Stderr))
		}
		return err
	}
	return nil
}

// Wait waits up to timeout for the process to exit and returns its result.
func (p *Proc) Wait(timeout time.Duration) (Result, error) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		return Result{Stdout: p.stdout.String(), Stderr: p.stderr.String()},
			fmt.Errorf("process %d (%v) still running after %s; stderr:\n%s", p.Pid(), p.Cmd.Args[1:], timeout, tail(p.stderr.String()))
	}
	r := Result{Code: p.Cmd.ProcessState.ExitCode(), Stdout: p.stdout.String(), Stderr: p.stderr.String()}
	if ws, ok := p.Cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		r.Killed = true
	}
	var obj map[string]any
	if json.Unmarshal([]byte(strings.TrimSpace(r.Stdout)), &obj) == nil {
		r.Obj = obj
	}
	return r, nil
}

// Stderr returns what the process wrote to stderr so far.
func (p *Proc) Stderr() string { return p.stderr.String() }

// Gw runs one gateway CLI command to completion (2 minutes at most).
func Gw(t testing.TB, bin, dbURL string, env []string, args ...string) Result {
	t.Helper()
	p := Start(t, bin, dbURL, env, args...)
	r, err := p.Wait(2 * time.Minute)
	if err != nil {
		t.Fatalf("gateway %v: %v", args, err)
	}
	return r
}

// Expect fails the test unless r exited with code (and, when errCode is
// not empty, its JSON error has that code).
func Expect(t testing.TB, r Result, code int, errCode string) {
	t.Helper()
	if r.Code != code || (errCode != "" && r.ErrCode() != errCode) {
		t.Fatalf("exit %d (killed=%v), want %d %s\nstdout: %s\nstderr: %s", r.Code, r.Killed, code, errCode, r.Stdout, tail(r.Stderr))
	}
}

// Poll calls cond until it reports true or timeout passes, then fails the
// test naming what it waited for and cond's last detail. It waits a little
// between calls (cond may start processes).
func Poll(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if err := PollErr(timeout, what, cond); err != nil {
		t.Fatal(err)
	}
}

// PollRunning is Poll while the processes procs (by name) run: it fails
// the test at once, with the tail of the process's stderr, when one of
// them has exited, since a daemon that died can only make cond time out.
func PollRunning(t testing.TB, procs map[string]*Proc, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	Poll(t, timeout, what, func() (bool, string) {
		for name, p := range procs {
			if p.Exited() {
				t.Fatalf("%s exited:\n%s", name, tail(p.Stderr()))
			}
		}
		return cond()
	})
}

// PollErr is Poll returning an error instead of failing a test.
func PollErr(timeout time.Duration, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s; last: %s", timeout, what, detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string) string {
	const n = 4000
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// SyncBuffer is a bytes.Buffer safe for a writer and a reader on
// different goroutines (a process's or a logger's output read by a test).
type SyncBuffer = toolbin.SyncBuffer
