package toolbin

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// SyncBuffer is a bytes.Buffer safe for a writer and a reader on
// different goroutines (a process's or a logger's output read by a test).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// Another process may take it before the server started on it binds it:
// a caller retries its start.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Answers reports whether a TCP connection to addr opens within timeout.
func Answers(addr string, timeout time.Duration) bool {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// Process is a server process a test started from nothing (a tool found by
// Find): it dies with the test process, and Stop ends it.
type Process struct {
	// Cmd is the process.
	Cmd *exec.Cmd
	// Output holds what it wrote to stdout and stderr, unless Cmd had
	// writers of its own.
	Output *SyncBuffer
	exited chan struct{}
}

// Start starts cmd, killed when the test process dies without cleaning
// up (SetPdeathsig), and waits for it in the background.
func Start(cmd *exec.Cmd) (*Process, error) {
	p := &Process{Cmd: cmd, Output: &SyncBuffer{}, exited: make(chan struct{})}
	if cmd.Stdout == nil && cmd.Stderr == nil {
		cmd.Stdout, cmd.Stderr = p.Output, p.Output
	}
	SetPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Exited is closed once the process has exited and been waited for.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// WaitReady calls ready until it reports true, and fails when the process
// exits first or timeout passes. The caller stops the process on failure.
func (p *Process) WaitReady(name string, timeout time.Duration, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-p.exited:
			return errors.New(name + " exited before it was ready")
		default:
		}
		if ready() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s", name, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop sends SIGTERM, SIGKILL after 5 s, and waits for the process to
// exit. It does nothing when the process has exited.
func (p *Process) Stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	WaitOrKill(p.Cmd.Process, p.exited, 5*time.Second)
}

// WaitOrKill waits up to grace for exited (closed when proc has been
// waited for) to close; past it, it kills proc with SIGKILL and waits on.
func WaitOrKill(proc *os.Process, exited <-chan struct{}, grace time.Duration) {
	select {
	case <-exited:
	case <-time.After(grace):
		_ = proc.Kill()
		<-exited
	}
}
