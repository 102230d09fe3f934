package testdb

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
)

// ExampleTB is the testing.TB an Example function has not got, so that an
// example can take a database (NewURL, New), a server (natstest.Start) or
// a directory (TempDir) from the test kits and run, its output checked: a
// failure panics, which fails the example with the message, and what the
// kits clean up is cleaned up when Run ends, after the examples and before
// the throwaway cluster stops.
func ExampleTB() testing.TB { return exampleTB{} }

// exampleTB implements what the test kits call; the embedded TB is nil, so
// any other method panics.
type exampleTB struct{ testing.TB }

var (
	exampleMu       sync.Mutex
	exampleCleanups []func()
)

func (exampleTB) Helper()                           {}
func (exampleTB) Name() string                      { return "Example" }
func (exampleTB) Failed() bool                      { return false }
func (exampleTB) Context() context.Context          { return context.Background() }
func (exampleTB) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (exampleTB) Error(args ...any)                 { panic(fmt.Sprint(args...)) }
func (exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// Log and Logf write to standard error: standard output is the example's
// output, checked against its Output line.
func (exampleTB) Log(args ...any)                 { fmt.Fprintln(os.Stderr, args...) }
func (exampleTB) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

func (exampleTB) Cleanup(f func()) {
	exampleMu.Lock()
	defer exampleMu.Unlock()
	exampleCleanups = append(exampleCleanups, f)
}

func (tb exampleTB) TempDir() string {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		tb.Fatalf("testdb: example directory: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// runExampleCleanups runs the examples' cleanups, the last registered
// first, as a test's are.
func runExampleCleanups() {
	exampleMu.Lock()
	fs := exampleCleanups
	exampleCleanups = nil
	exampleMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
