package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func dirIdentity(t *testing.T, dir string) string {
	t.Helper()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// openTempDir opens a fresh directory, to be fsynced; closed when the test
// ends.
func openTempDir(t *testing.T) *os.File {
	t.Helper()
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	return dir
}

func isDir(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.IsDir()
}

// Concurrent publications into one directory share its fsyncs: while one
// directory fsync runs, the others wait for the next one instead of each
// issuing their own, at most one runs at a time, and every publication
// completes with its content and manifest in place.
func TestConcurrentPublicationsShareDirectoryFsyncs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	execute(t, b.a, request("d/first", 1, 1, "k-first", "first\n"))
	key := dirIdentity(t, filepath.Join(b.root, "d"))

	const n = 8
	var (
		dirSyncs, inFlight, maxInFlight atomic.Int64
		held                            atomic.Bool
		gate                            = make(chan struct{})
	)
	b.a.syncHook = func(f *os.File) error {
		if !isDir(f) {
			return f.Sync()
		}
		dirSyncs.Add(1)
		cur := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := maxInFlight.Load(); cur > m && !maxInFlight.CompareAndSwap(m, cur); m = maxInFlight.Load() {
		}
		if held.CompareAndSwap(false, true) {
			<-gate // the first directory fsync is slow
		}
		return f.Sync()
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = b.a.Execute(context.Background(),
				request(fmt.Sprintf("d/t%d", i), 1, int64(10+i), fmt.Sprintf("k%d", i), fmt.Sprintf("content %d\n", i)))
		})
	}
	// Every other publication reached a directory fsync while the first
	// one runs, and waits for the next instead of issuing its own.
	waitFor(t, fmt.Sprintf("%d publications to wait for a shared directory fsync", n-1), func() bool {
		return held.Load() && b.a.dirs.parked(key) == n-1
	})
	close(gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("publication %d: %v", i, err)
		}
		if got := readFile(t, filepath.Join(b.root, fmt.Sprintf("d/t%d", i))); got != fmt.Sprintf("content %d\n", i) {
			t.Fatalf("t%d = %q", i, got)
		}
		if m := published(t, b.a, fmt.Sprintf("d/t%d", i)); m.State != StatePublished || m.IdempotencyKey != fmt.Sprintf("k%d", i) {
			t.Fatalf("manifest of t%d = %+v", i, m)
		}
	}
	// Unshared, each publication fsyncs the directory twice.
	if got := dirSyncs.Load(); got >= 2*n {
		t.Errorf("%d directory fsyncs for %d publications; want fewer than %d", got, n, 2*n)
	}
	if got := maxInFlight.Load(); got != 1 {
		t.Errorf("%d directory fsyncs ran at once; want 1", got)
	}
	t.Logf("%d publications, %d directory fsyncs", n, dirSyncs.Load())
}

// A caller that arrives while an fsync runs is not served by it (it may
// have started before the caller's rename) but by the next one, which
// starts after the caller arrived.
func TestDirSyncWaitsForAnFsyncStartedAfterIt(t *testing.T) {
	t.Parallel()
	dir := openTempDir(t)
	var s dirSyncer
	var started atomic.Int64
	gates := []chan struct{}{make(chan struct{}), make(chan struct{})}
	syncFn := func(f *os.File) error {
		g := started.Add(1)
		if g <= int64(len(gates)) {
			<-gates[g-1]
		}
		return f.Sync()
	}
	aDone, bDone := make(chan error, 1), make(chan error, 1)
	go func() { aDone <- s.sync("k", dir, syncFn) }()
	waitFor(t, "the first fsync to start", func() bool { return started.Load() == 1 })
	go func() { bDone <- s.sync("k", dir, syncFn) }()
	waitFor(t, "the second caller to wait", func() bool { return s.parked("k") == 1 })
	close(gates[0])
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	// The second caller now runs an fsync of its own: the first one does
	// not count for it.
	waitFor(t, "a second fsync, started after the second caller arrived", func() bool { return started.Load() == 2 })
	select {
	case err := <-bDone:
		t.Fatalf("the second caller returned (%v) before an fsync that started after it completed", err)
	default:
	}
	close(gates[1])
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	if s.m["k"] != nil {
		t.Error("the directory's entry outlived its callers")
	}
}

// A failed fsync fails every caller it served, as their own would have; a
// caller served by an earlier fsync that succeeded is not failed.
func TestDirSyncFailureFailsTheCallersItServed(t *testing.T) {
	t.Parallel()
	dir := openTempDir(t)
	var s dirSyncer
	eio := errors.New("fsync: input/output error")
	var started atomic.Int64
	gate := make(chan struct{})
	syncFn := func(f *os.File) error {
		if started.Add(1) == 1 {
			<-gate
			return nil
		}
		return eio
	}
	first := make(chan error, 1)
	go func() { first <- s.sync("k", dir, syncFn) }()
	waitFor(t, "the first fsync to start", func() bool { return started.Load() == 1 })
	const waiters = 3
	rest := make(chan error, waiters)
	for range waiters {
		go func() { rest <- s.sync("k", dir, syncFn) }()
	}
	waitFor(t, "the callers to wait", func() bool { return s.parked("k") == waiters })
	close(gate)
	if err := <-first; err != nil {
		t.Fatalf("the first caller: %v", err)
	}
	for range waiters {
		if err := <-rest; !errors.Is(err, eio) {
			t.Fatalf("a caller served by the failed fsync got %v", err)
		}
	}
	if got := started.Load(); got != 2 {
		t.Fatalf("%d fsyncs; want 2 (the waiters shared one)", got)
	}
}

// A publication fsyncs its directory twice: after the manifest ahead and
// after the content rename. Marking the manifest published afterwards is a
// shortcut the content's sha proves, so it does not wait for a third.
func TestMarkDoesNotWaitForADirectoryFsync(t *testing.T) {
	t.Parallel()
	b := setup(t)
	execute(t, b.a, request("d/first", 1, 1, "k-first", "first\n"))
	var dirSyncs, fileSyncs atomic.Int64
	b.a.syncHook = func(f *os.File) error {
		if isDir(f) {
			dirSyncs.Add(1)
		} else {
			fileSyncs.Add(1)
		}
		return f.Sync()
	}
	execute(t, b.a, request("d/second", 1, 2, "k-second", "second\n"))
	if got := dirSyncs.Load(); got != 2 {
		t.Errorf("%d directory fsyncs for one publication; want 2", got)
	}
	// The staged content, the manifest ahead, the marked manifest.
	if got := fileSyncs.Load(); got != 3 {
		t.Errorf("%d file fsyncs for one publication; want 3", got)
	}
	data, err := os.ReadFile(filepath.Join(b.root, "d", ".second"+manifestSuffix))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"state": "published"`) {
		t.Fatalf("manifest as stored: %s", data)
	}
}
