// Package jsonproc runs a program a test drives: lines to its standard
// input, and JSON objects, one a line, read back from its standard output
// (the client drivers and paused workers of clients/). What it wrote to
// standard error is in each failure the test reports.
package jsonproc

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// Proc is a started program. Its methods fail the test that started it.
type Proc struct {
	t       testing.TB
	name    string // the program in failures: "the driver", "the worker"
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string // closed at the end of its output, after readErr is set
	readErr error
	stderr  toolbin.SyncBuffer
	exited  chan struct{} // closed once Wait returned, after waitErr is set
	waitErr error
}

// Start starts cmd (its Stdin, Stdout and Stderr unset), named name in the
// test's failures. The test's cleanup kills it, stopped (SIGSTOP) or not,
// and waits for it.
func Start(t testing.TB, name string, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{t: t, name: name, cmd: cmd, lines: make(chan string, 16), exited: make(chan struct{})}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	// A pipe of its own, not StdoutPipe: Wait closes that one when the
	// program exits, and the last lines it printed could be lost unread.
	stdout, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stdin = stdin
	cmd.Stdout, cmd.Stderr = w, &p.stderr
	err = cmd.Start()
	_ = w.Close() // the program's copy stays open until it exits
	if err != nil {
		_ = stdout.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		defer stdout.Close()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		p.readErr = sc.Err()
		close(p.lines)
	}()
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// Stderr is what the program wrote to its standard error so far.
func (p *Proc) Stderr() string { return p.stderr.String() }

// Send writes line and a newline to the program's input.
func (p *Proc) Send(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatalf("writing %q to %s: %v\nstderr: %s", line, p.name, err, p.Stderr())
	}
}

// CloseInput closes the program's input.
func (p *Proc) CloseInput() { _ = p.stdin.Close() }

// Next is the next line of the program's output, what the test waits for,
// decoded: it must come within d, and be one JSON object.
func (p *Proc) Next(what string, d time.Duration) map[string]any {
	p.t.Helper()
	select {
	case s, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("the output of %s ended before %s (%v)\nstderr: %s", p.name, what, p.readErr, p.Stderr())
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			p.t.Fatalf("%s printed %q for %s, not a JSON object: %v\nstderr: %s", p.name, s, what, err, p.Stderr())
		}
		return m
	case <-time.After(d):
		p.t.Fatalf("no %s from %s within %s\nstderr: %s", what, p.name, d, p.Stderr())
	}
	return nil
}

// Signal sends sig to the program.
func (p *Proc) Signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
}

// Wait waits up to d for the program to exit, and returns how it ended
// (nil for exit status 0), or an error saying it did not end within d.
func (p *Proc) Wait(d time.Duration) error {
	select {
	case <-p.exited:
		return p.waitErr
	case <-time.After(d):
		return fmt.Errorf("%s did not exit within %s", p.name, d)
	}
}
