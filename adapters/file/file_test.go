package file

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/outbox"
)

// bundle is what a test needs: an adapter on a fresh root, and a counter
// of staged content writes (a publication that rewrote the file).
type bundle struct {
	a      *Adapter
	root   string
	writes *atomic.Int64
}

func setup(t *testing.T, mods ...func(*Config)) bundle {
	t.Helper()
	cfg := Config{Root: t.TempDir()}
	for _, m := range mods {
		m(&cfg)
	}
	return newBundle(t, cfg)
}

func newBundle(t *testing.T, cfg Config) bundle {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	writes := new(atomic.Int64)
	a.writeHook = func(f *os.File, p []byte) error {
		writes.Add(1)
		_, err := f.Write(p)
		return err
	}
	return bundle{a: a, root: a.Root(), writes: writes}
}

func request(target string, epoch, intentID int64, key, content string) adapters.Request {
	p, _ := json.Marshal(map[string]string{"target": target, "content": content})
	return adapters.Request{
		IntentID: intentID, Resource: "nightly-report", Epoch: epoch, Kind: Kind,
		IdempotencyKey: key, Fence: outbox.FenceExecute, Payload: p, Attempt: 1,
	}
}

func execute(t *testing.T, a *Adapter, req adapters.Request) adapters.Outcome {
	t.Helper()
	out, err := a.Execute(context.Background(), req)
	if err != nil {
		t.Fatalf("Execute(intent %d, epoch %d): %v", req.IntentID, req.Epoch, err)
	}
	return out
}

func lookup(t *testing.T, a *Adapter, req adapters.Request) (adapters.Outcome, bool) {
	t.Helper()
	out, found, err := a.Lookup(context.Background(), req)
	if err != nil {
		t.Fatalf("Lookup(intent %d): %v", req.IntentID, err)
	}
	return out, found
}

func result(t *testing.T, out adapters.Outcome) Result {
	t.Helper()
	return decodeOutcome[Result](t, out, outbox.StatusSucceeded)
}

func superseded(t *testing.T, out adapters.Outcome) SupersededResult {
	t.Helper()
	return decodeOutcome[SupersededResult](t, out, outbox.StatusSuperseded)
}

// decodeOutcome checks that out has the status want and decodes its result.
func decodeOutcome[R any](t *testing.T, out adapters.Outcome, want outbox.Status) R {
	t.Helper()
	if out.Status != want {
		t.Fatalf("status = %s, want %s (result %s)", out.Status, want, out.Result)
	}
	var r R
	if err := json.Unmarshal(out.Result, &r); err != nil {
		t.Fatalf("decode result %s: %v", out.Result, err)
	}
	return r
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

func published(t *testing.T, a *Adapter, target string) Manifest {
	t.Helper()
	m, ok, err := a.Published(target)
	if err != nil || !ok {
		t.Fatalf("Published(%q) = ok %v, err %v", target, ok, err)
	}
	return m
}

// rawManifest reads the manifest as stored, without resolving a pending
// publication.
func rawManifest(t *testing.T, root, target string) Manifest {
	t.Helper()
	dir, name := filepath.Split(filepath.Join(root, target))
	var m Manifest
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(dir, "."+name+manifestSuffix))), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func inode(t *testing.T, path string) (uint64, time.Time) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino, fi.ModTime()
}

func wantPermanent(t *testing.T, err error, sentinel error) {
	t.Helper()
	var ae *adapters.Error
	if !errors.As(err, &ae) || ae.Retry || ae.Unknown {
		t.Fatalf("error = %v, want a permanent *adapters.Error", err)
	}
	if sentinel != nil && !errors.Is(err, sentinel) {
		t.Fatalf("error = %v, want errors.Is %v", err, sentinel)
	}
}

// The article's scenario at the destination: A holds epoch 33, pauses, B
// takes over with 34. Whatever order their publications arrive in, B's
// content is what stays, and A's is either rejected or replaced.
func TestArticleScenario(t *testing.T) {
	t.Parallel()
	const target = "reports/2026-12-01.txt"
	a33 := request(target, 33, 1, "report/2026-12-01/by-a", "report computed by A (epoch 33)\n")
	b34 := request(target, 34, 2, "report/2026-12-01/by-b", "report computed by B (epoch 34)\n")

	t.Run("B first, then paused A", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rb := result(t, execute(t, b.a, b34))
		if rb.Epoch != 34 || rb.Path != target || rb.IntentID != 2 || rb.IdempotencyKey != b34.IdempotencyKey || rb.Bytes != 32 {
			t.Fatalf("B's result = %+v", rb)
		}
		ra := superseded(t, execute(t, b.a, a33))
		if ra != (SupersededResult{Path: target, RejectedEpoch: 33, CurrentEpoch: 34, CurrentIntentID: 2}) {
			t.Fatalf("A's result = %+v", ra)
		}
		if got := readFile(t, filepath.Join(b.root, target)); got != "report computed by B (epoch 34)\n" {
			t.Fatalf("content = %q, want B's", got)
		}
		if n := b.writes.Load(); n != 1 {
			t.Fatalf("%d content writes, want 1 (A's must not even be staged)", n)
		}
		m := published(t, b.a, target)
		if m.Epoch != 34 || m.IdempotencyKey != b34.IdempotencyKey || m.State != StatePublished || len(m.History) != 0 {
			t.Fatalf("manifest = %+v", m)
		}
		if got, want := listDir(t, filepath.Join(b.root, "reports")), []string{".2026-12-01.txt.fencegate.json", ".2026-12-01.txt.fencegate.lock", "2026-12-01.txt"}; !slices.Equal(got, want) {
			t.Fatalf("directory holds %q, want %q", got, want)
		}
		// A's intent looked up: no trace, it never happened.
		if _, found := lookup(t, b.a, a33); found {
			t.Fatal("Lookup found A's rejected publication")
		}
	})

	t.Run("A first, then B", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if r := result(t, execute(t, b.a, a33)); r.Epoch != 33 {
			t.Fatalf("A's result = %+v", r)
		}
		if r := result(t, execute(t, b.a, b34)); r.Epoch != 34 {
			t.Fatalf("B's result = %+v", r)
		}
		if got := readFile(t, filepath.Join(b.root, target)); got != "report computed by B (epoch 34)\n" {
			t.Fatalf("content = %q, want B's", got)
		}
		m := published(t, b.a, target)
		if m.Epoch != 34 || len(m.History) != 1 || m.History[0].IdempotencyKey != a33.IdempotencyKey {
			t.Fatalf("manifest = %+v", m)
		}
		// Both happened, both are found.
		for _, r := range []adapters.Request{a33, b34} {
			if _, found := lookup(t, b.a, r); !found {
				t.Fatalf("Lookup(intent %d) not found", r.IntentID)
			}
		}
	})
}

func TestSameKeyIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const target = "out.txt"
	r := request(target, 7, 1, "k1", "hello\n")
	first := execute(t, b.a, r)
	ino, mtime := inode(t, filepath.Join(b.root, target))

	second := execute(t, b.a, r)
	if !bytes.Equal(first.Result, second.Result) || second.Status != outbox.StatusSucceeded {
		t.Fatalf("second outcome %s %s, want %s", second.Status, second.Result, first.Result)
	}
	// The business key dedups across epochs and intents: B re-running
	// the job A finished gets A's result, nothing is rewritten.
	rerun := request(target, 8, 2, "k1", "hello\n")
	if got := execute(t, b.a, rerun); !bytes.Equal(got.Result, first.Result) {
		t.Fatalf("rerun result %s, want %s", got.Result, first.Result)
	}
	if n := b.writes.Load(); n != 1 {
		t.Fatalf("%d content writes, want 1", n)
	}
	if ino2, mtime2 := inode(t, filepath.Join(b.root, target)); ino2 != ino || !mtime2.Equal(mtime) {
		t.Fatal("the file was replaced by a duplicate")
	}

	// The same key with other content is a conflict, never a second write.
	_, err := b.a.Execute(context.Background(), request(target, 9, 3, "k1", "other\n"))
	wantPermanent(t, err, ErrKeyConflict)
	if _, found := lookup(t, b.a, request(target, 9, 3, "k1", "other\n")); found {
		t.Fatal("Lookup found a key with different content")
	}
	if got := readFile(t, filepath.Join(b.root, target)); got != "hello\n" {
		t.Fatalf("content = %q", got)
	}
}

// A response lost after the publication (the runtime crashed before
// recording it in PostgreSQL): Lookup answers with the recorded result, and
// a redelivery executes nothing, even after newer epochs published.
func TestLookupAfterLostOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const target = "a/b/c.txt"
	r := request(target, 34, 2, "k-b", "B\n")

	if _, found := lookup(t, b.a, r); found {
		t.Fatal("Lookup found a publication before any")
	}
	if got := listDir(t, b.root); len(got) != 0 {
		t.Fatalf("Lookup created %q", got)
	}

	want := execute(t, b.a, r).Result // ... and the result is lost
	ino, _ := inode(t, filepath.Join(b.root, target))

	out, found := lookup(t, b.a, r)
	if !found || out.Status != outbox.StatusSucceeded || !bytes.Equal(out.Result, want) {
		t.Fatalf("Lookup = %v %s %s, want found %s", found, out.Status, out.Result, want)
	}
	if _, found := lookup(t, b.a, request(target, 34, 3, "k-other", "B\n")); found {
		t.Fatal("Lookup found an unknown key")
	}
	if got := execute(t, b.a, r); !bytes.Equal(got.Result, want) {
		t.Fatalf("redelivery result %s, want %s", got.Result, want)
	}
	if n := b.writes.Load(); n != 1 {
		t.Fatalf("%d content writes, want 1", n)
	}
	if ino2, _ := inode(t, filepath.Join(b.root, target)); ino2 != ino {
		t.Fatal("the redelivery replaced the file")
	}

	// A newer epoch publishes; B's key is still found, and a late
	// redelivery of B is its recorded success, not "superseded".
	execute(t, b.a, request(target, 35, 4, "k-d", "D\n"))
	if out, found := lookup(t, b.a, r); !found || !bytes.Equal(out.Result, want) {
		t.Fatalf("after epoch 35: Lookup = %v %s", found, out.Result)
	}
	if got := execute(t, b.a, r); got.Status != outbox.StatusSucceeded || !bytes.Equal(got.Result, want) {
		t.Fatalf("late redelivery = %s %s", got.Status, got.Result)
	}
	if got := readFile(t, filepath.Join(b.root, target)); got != "D\n" {
		t.Fatalf("content = %q, want D's", got)
	}
}

type crash struct{}

// runCrashing runs Execute, which is expected to "crash" by panicking with
// crash{} from a hook; the deferred unlock plays the kernel's part of
// releasing the flock of a dead process.
func runCrashing(t *testing.T, a *Adapter, req adapters.Request) {
	t.Helper()
	defer func() {
		if r := recover(); r != (crash{}) {
			t.Fatalf("Execute did not crash at the hook: recovered %v", r)
		}
	}()
	_, err := a.Execute(context.Background(), req)
	t.Fatalf("Execute returned %v", err)
}

// Crash after the content rename and before the manifest is marked
// published (and before the runtime records the outcome).
func TestCrashAfterRename(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	const target = "report.txt"
	a33 := request(target, 33, 1, "k-a", "A\n")
	b34 := request(target, 34, 2, "k-b", "B\n")

	crashing := newBundle(t, Config{Root: root, AfterRename: func(string) { panic(crash{}) }})
	runCrashing(t, crashing.a, b34)

	if m := rawManifest(t, root, target); m.State != StatePending || m.Epoch != 34 || m.IdempotencyKey != "k-b" {
		t.Fatalf("stored manifest = %+v, want pending epoch 34 of k-b", m)
	}
	b := newBundle(t, Config{Root: root}) // the restarted adapter
	if m := published(t, b.a, target); m.State != StatePublished {
		t.Fatalf("Published state = %s, want published (the content is in place)", m.State)
	}
	out, found := lookup(t, b.a, b34)
	if !found {
		t.Fatal("Lookup did not find the publication")
	}
	if r := result(t, out); r.Epoch != 34 || r.IntentID != 2 || r.SHA256 != sha256Hex([]byte("B\n")) {
		t.Fatalf("Lookup result = %+v", r)
	}
	ino, _ := inode(t, filepath.Join(root, target))
	if got := execute(t, b.a, b34); !bytes.Equal(got.Result, out.Result) {
		t.Fatalf("redelivery result %s, want %s", got.Result, out.Result)
	}
	if n := b.writes.Load(); n != 0 {
		t.Fatalf("the redelivery rewrote the file (%d writes)", n)
	}
	if ino2, _ := inode(t, filepath.Join(root, target)); ino2 != ino {
		t.Fatal("the redelivery replaced the file")
	}
	if m := rawManifest(t, root, target); m.State != StatePublished {
		t.Fatalf("stored state after redelivery = %s, want published", m.State)
	}
	// The paused epoch-33 worker cannot slip in.
	superseded(t, execute(t, b.a, a33))
	if got := readFile(t, filepath.Join(root, target)); got != "B\n" {
		t.Fatalf("content = %q", got)
	}
}

// Crash after the write-ahead manifest and before the content rename: the
// epoch is accepted, the content is not there, nobody older slips in, and
// the redelivery publishes.
func TestCrashBeforeRename(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	const target = "report.txt"
	b := newBundle(t, Config{Root: root})
	a33 := request(target, 33, 1, "k-a", "A\n")
	execute(t, b.a, a33)

	b34 := request(target, 34, 2, "k-b", "B\n")
	crashing := newBundle(t, Config{Root: root})
	crashing.a.beforeRename = func() { panic(crash{}) }
	runCrashing(t, crashing.a, b34)

	if got := readFile(t, filepath.Join(root, target)); got != "A\n" {
		t.Fatalf("content = %q, want A's", got)
	}
	if m := published(t, b.a, target); m.State != StatePending || m.Epoch != 34 {
		t.Fatalf("manifest = %+v, want pending epoch 34", m)
	}
	if _, found := lookup(t, b.a, b34); found {
		t.Fatal("Lookup found a publication whose rename never happened")
	}
	if _, found := lookup(t, b.a, a33); !found {
		t.Fatal("Lookup lost A's publication")
	}
	if r := superseded(t, execute(t, b.a, request(target, 33, 3, "k-a2", "A2\n"))); r.CurrentEpoch != 34 {
		t.Fatalf("superseded result = %+v", r)
	}
	result(t, execute(t, b.a, b34)) // the redelivery
	if got := readFile(t, filepath.Join(root, target)); got != "B\n" {
		t.Fatalf("content = %q, want B's", got)
	}
	m := published(t, b.a, target)
	if m.State != StatePublished || len(m.History) != 1 || m.History[0].IdempotencyKey != "k-a" {
		t.Fatalf("manifest = %+v, want B published after A", m)
	}
	if got := listDir(t, root); slices.ContainsFunc(got, func(n string) bool { return strings.HasSuffix(n, stagedSuffix) }) {
		t.Fatalf("staged file left behind: %q", got)
	}
}

const helperEnv = "FENCEGATE_FILE_HELPER_ROOT"

// TestHelperProcess is the child of TestSubprocessCrash: it publishes and
// dies (exit 3) right after the content rename.
func TestHelperProcess(t *testing.T) {
	root := os.Getenv(helperEnv)
	if root == "" {
		t.Skip("helper process for TestSubprocessCrash")
	}
	a, err := New(Config{Root: root, AfterRename: func(string) { os.Exit(3) }})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_, err = a.Execute(context.Background(), request("out/report.txt", 34, 2, "k-b", "B\n"))
	fmt.Fprintln(os.Stderr, "Execute returned instead of crashing:", err)
	os.Exit(1)
}

func TestSubprocessCrash(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+root)
	outb, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("helper: %v, want exit 3; output:\n%s", err, outb)
	}

	b := newBundle(t, Config{Root: root})
	b34 := request("out/report.txt", 34, 2, "k-b", "B\n")
	out, found := lookup(t, b.a, b34)
	if !found {
		t.Fatal("Lookup did not find the crashed publication")
	}
	if got := execute(t, b.a, b34); !bytes.Equal(got.Result, out.Result) {
		t.Fatalf("redelivery %s, want %s", got.Result, out.Result)
	}
	if n := b.writes.Load(); n != 0 {
		t.Fatalf("published twice (%d writes)", n)
	}
	superseded(t, execute(t, b.a, request("out/report.txt", 33, 1, "k-a", "A\n")))
	if got := readFile(t, filepath.Join(root, "out/report.txt")); got != "B\n" {
		t.Fatalf("content = %q", got)
	}
}

// Many publishers of one target with random epochs, and a reader that
// must only ever see complete contents: the highest epoch wins, and the
// publications that happened did so in increasing epoch order.
func TestConcurrentPublishers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const target = "hot/file.bin"
	const publishers, each = 32, 4
	const n = publishers * each
	epochs := rand.Perm(n)
	reqs := make([]adapters.Request, n)
	contents := make(map[string]int64, n) // content → epoch
	for i := range n {
		epoch := int64(epochs[i] + 1)
		body := fmt.Sprintf("epoch %d\n%s", epoch, strings.Repeat(string(rune('a'+i%26)), 32<<10+i))
		reqs[i] = request(target, epoch, int64(100+i), fmt.Sprintf("k-%d", epoch), body)
		contents[body] = epoch
	}

	done := make(chan struct{})
	var reads atomic.Int64
	var readers sync.WaitGroup
	readers.Go(func() {
		path := filepath.Join(b.root, target)
		for {
			select {
			case <-done:
				return
			default:
			}
			data, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				t.Errorf("read: %v", err)
				return
			}
			if _, ok := contents[string(data)]; !ok {
				t.Errorf("read a torn or unknown content of %d bytes", len(data))
				return
			}
			reads.Add(1)
		}
	})

	outs := make([]adapters.Outcome, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			<-start
			for i := p * each; i < (p+1)*each; i++ {
				out, err := b.a.Execute(context.Background(), reqs[i])
				if err != nil {
					t.Errorf("Execute(epoch %d): %v", reqs[i].Epoch, err)
				}
				outs[i] = out
			}
		})
	}
	close(start)
	wg.Wait()
	close(done)
	readers.Wait()
	if t.Failed() {
		return
	}

	if got := contents[readFile(t, filepath.Join(b.root, target))]; got != n {
		t.Fatalf("final content is epoch %d's, want %d's", got, n)
	}
	m := published(t, b.a, target)
	if m.Epoch != n {
		t.Fatalf("manifest epoch %d, want %d", m.Epoch, n)
	}
	var succeeded []int64
	for i, out := range outs {
		switch out.Status {
		case outbox.StatusSucceeded:
			succeeded = append(succeeded, reqs[i].Epoch)
		case outbox.StatusSuperseded:
			var r SupersededResult
			if err := json.Unmarshal(out.Result, &r); err != nil || r.CurrentEpoch <= r.RejectedEpoch {
				t.Fatalf("superseded result %s", out.Result)
			}
		default:
			t.Fatalf("status %s", out.Status)
		}
	}
	// The manifest's history is the order publications happened in: it
	// must be exactly the succeeded ones, epochs strictly increasing.
	var order []int64
	for _, p := range append(m.History, m.Publication) {
		order = append(order, p.Epoch)
	}
	slices.Sort(succeeded)
	if !slices.Equal(order, succeeded) {
		t.Fatalf("publication order %v, succeeded %v: not the succeeded epochs in increasing order", order, succeeded)
	}
	t.Logf("%d publications succeeded, %d superseded, %d complete reads", len(succeeded), n-len(succeeded), reads.Load())
}

// Another holder of the lock (as another process would be) makes Execute
// wait; the wait ends with the context, as a retryable error.
func TestWaitsForLockHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	execute(t, b.a, request("x.txt", 1, 1, "k1", "one\n"))
	lf, err := os.OpenFile(filepath.Join(b.root, ".x.txt"+lockSuffix), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = b.a.Execute(ctx, request("x.txt", 2, 2, "k2", "two\n"))
	if !adapters.IsRetryable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Execute under a held lock: %v, want retryable deadline", err)
	}

	res := make(chan error, 1)
	go func() {
		_, err := b.a.Execute(context.Background(), request("x.txt", 2, 2, "k2", "two\n"))
		res <- err
	}()
	select {
	case err := <-res:
		t.Fatalf("Execute finished while the lock was held: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if got := readFile(t, filepath.Join(b.root, "x.txt")); got != "one\n" {
		t.Fatalf("content changed under a held lock: %q", got)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("Execute after unlock: %v", err)
	}
	if got := readFile(t, filepath.Join(b.root, "x.txt")); got != "two\n" {
		t.Fatalf("content = %q", got)
	}
}

func TestEscapesAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	rel, err := filepath.Rel(b.root, outside)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, to := range map[string]string{
		"evil":                outside, // a directory outside
		"passwd":              secret,  // a file outside
		"rel-evil":            rel,     // relative, still outside
		"dangling":            filepath.Join(outside, "nope"),
		"inner.txt":           "real.txt", // a file symlink inside the root: refused too
		"sub/up":              "../..",
		".x.fencegate.staged": secret,
	} {
		p := filepath.Join(b.root, link)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(to, p); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		target   string
		sentinel error
	}{
		{"../x", ErrOutsideRoot},
		{"a/../../x", ErrOutsideRoot},
		{"/etc/passwd", ErrOutsideRoot},
		{"evil/x", ErrOutsideRoot},
		{"evil/deeper/x", ErrOutsideRoot},
		{"rel-evil/x", ErrOutsideRoot},
		{"passwd", ErrOutsideRoot},
		{"dangling/x", ErrOutsideRoot},
		{"inner.txt", ErrOutsideRoot},
		{"sub/up/x", ErrOutsideRoot},
		{".x.fencegate.json", ErrBadPayload},
		{"d/.y.fencegate.lock/z", ErrBadPayload},
		{"a//b", ErrBadPayload},
	} {
		_, err := b.a.Execute(context.Background(), request(tc.target, 1, 1, "k", "pwned\n"))
		wantPermanent(t, err, tc.sentinel)
		// Nothing can have been published there: no trace, and Execute
		// reports the permanent error.
		if _, found, err := b.a.Lookup(context.Background(), request(tc.target, 1, 1, "k", "pwned\n")); found || err != nil {
			t.Fatalf("Lookup(%q) = %v, %v; want not found", tc.target, found, err)
		}
	}
	if got := listDir(t, outside); !slices.Equal(got, []string{"secret"}) {
		t.Fatalf("outside the root: %q", got)
	}
	if got := readFile(t, secret); got != "secret\n" {
		t.Fatalf("secret = %q", got)
	}

	// A leftover staged name that is a symlink is replaced, not followed.
	result(t, execute(t, b.a, request("x", 1, 1, "k", "fine\n")))
	if got := readFile(t, secret); got != "secret\n" {
		t.Fatalf("secret = %q after publishing beside a planted staged symlink", got)
	}
}

// Symbolic links to directories inside the root are followed, even
// absolute ones, and the fence is the real file's: two spellings of one
// file cannot be used to bypass it.
func TestSymlinkInsideRootSharesFence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := os.Mkdir(filepath.Join(b.root, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(b.root, "real"), filepath.Join(b.root, "alias")); err != nil {
		t.Fatal(err)
	}
	result(t, execute(t, b.a, request("alias/x.txt", 5, 1, "k5", "five\n")))
	if got := readFile(t, filepath.Join(b.root, "real/x.txt")); got != "five\n" {
		t.Fatalf("content = %q", got)
	}
	if r := superseded(t, execute(t, b.a, request("real/x.txt", 4, 2, "k4", "four\n"))); r.CurrentEpoch != 5 {
		t.Fatalf("result = %+v", r)
	}
}

func TestPayloads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bin := []byte{0, 1, 2, 0xfe, 0xff, '\n', 0}
	p, _ := json.Marshal(map[string]string{"target": "bin/blob", "content_base64": base64.StdEncoding.EncodeToString(bin)})
	req := request("", 1, 1, "k-bin", "")
	req.Payload = p
	r := result(t, execute(t, b.a, req))
	if got := readFile(t, filepath.Join(b.root, "bin/blob")); got != string(bin) {
		t.Fatalf("content = %q", got)
	}
	if r.Bytes != int64(len(bin)) || r.SHA256 != sha256Hex(bin) {
		t.Fatalf("result = %+v", r)
	}
	if fi, err := os.Stat(filepath.Join(b.root, "bin/blob")); err != nil || fi.Mode().Perm() != DefaultFileMode {
		t.Fatalf("mode: %v %v", fi.Mode(), err)
	}

	for name, payload := range map[string]string{
		"both":       `{"target":"t","content":"a","content_base64":"YQ=="}`,
		"neither":    `{"target":"t"}`,
		"bad base64": `{"target":"t","content_base64":"!!"}`,
		"no target":  `{"content":"a"}`,
		"not json":   `[1]`,
		"unclean":    `{"target":"a/./b","content":"a"}`,
	} {
		req := request("", 1, 1, "k", "")
		req.Payload = json.RawMessage(payload)
		if _, err := b.a.Execute(context.Background(), req); err == nil {
			t.Fatalf("%s: no error", name)
		} else {
			wantPermanent(t, err, ErrBadPayload)
		}
	}
	noKey := request("t", 1, 1, "", "a")
	_, err := b.a.Execute(context.Background(), noKey)
	wantPermanent(t, err, ErrBadPayload)
}

// A disk that fails at each step of a publication. Before the switch the
// error is retryable and nothing visible changed; at the directory fsync
// after the switch the outcome is unknown (and Lookup settles it); at the
// final marking the publication stands.
func TestDiskFailures(t *testing.T) {
	t.Parallel()
	eio := &fs.PathError{Op: "fsync", Path: "x", Err: syscall.EIO}
	for _, tc := range []struct {
		name       string
		failWrite  bool
		failSync   int // fail the n-th fsync of the publication
		wantErr    func(error) bool
		wantResult string // content after
		wantFound  bool   // Lookup of B afterwards
	}{
		{name: "write ENOSPC", failWrite: true, wantErr: adapters.IsRetryable, wantResult: "A\n"},
		{name: "fsync staged", failSync: 1, wantErr: adapters.IsRetryable, wantResult: "A\n"},
		{name: "fsync manifest", failSync: 2, wantErr: adapters.IsRetryable, wantResult: "A\n"},
		{name: "fsync dir after manifest", failSync: 3, wantErr: adapters.IsRetryable, wantResult: "A\n"},
		{name: "fsync dir after rename", failSync: 4, wantErr: adapters.IsUnknown, wantResult: "B\n", wantFound: true},
		{name: "fsync final manifest", failSync: 5, wantErr: func(err error) bool { return err == nil }, wantResult: "B\n", wantFound: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			execute(t, b.a, request("d/f", 33, 1, "k-a", "A\n"))
			var syncs atomic.Int64
			if tc.failWrite {
				b.a.writeHook = func(f *os.File, p []byte) error {
					f.Write(p[:1])
					return &fs.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
				}
			}
			b.a.syncHook = func(f *os.File) error {
				if syncs.Add(1) == int64(tc.failSync) {
					return eio
				}
				return f.Sync()
			}
			b34 := request("d/f", 34, 2, "k-b", "B\n")
			_, err := b.a.Execute(context.Background(), b34)
			if !tc.wantErr(err) {
				t.Fatalf("Execute: %v", err)
			}
			if got := readFile(t, filepath.Join(b.root, "d/f")); got != tc.wantResult {
				t.Fatalf("content = %q, want %q", got, tc.wantResult)
			}
			if got := listDir(t, filepath.Join(b.root, "d")); len(got) != 3 {
				t.Fatalf("directory holds %q, want the file, its manifest and lock", got)
			}
			b.a.syncHook, b.a.writeHook = nil, nil
			if _, found := lookup(t, b.a, b34); found != tc.wantFound {
				t.Fatalf("Lookup found = %v, want %v", found, tc.wantFound)
			}
			// The retry settles it either way, with B's content in place.
			result(t, execute(t, b.a, b34))
			if got := readFile(t, filepath.Join(b.root, "d/f")); got != "B\n" {
				t.Fatalf("content after retry = %q", got)
			}
		})
	}
}

func TestForeignResourceIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	execute(t, b.a, request("f", 100, 1, "k1", "one\n"))
	other := request("f", 200, 2, "k2", "two\n")
	other.Resource = "another-resource"
	_, err := b.a.Execute(context.Background(), other)
	wantPermanent(t, err, ErrForeignResource)
}

func TestConfig(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{}, "Root"},
		{Config{Root: root, DirMode: 0o055}, "DirMode"},
		{Config{Root: root, FileMode: 0o444}, "FileMode"},
		{Config{Root: root, HistoryLimit: -1}, "HistoryLimit"},
		{Config{Root: root, MaxBytes: -1}, "MaxBytes"},
		{Config{Root: root, Allow: []string{"reports/["}}, "Allow"},
	} {
		for _, err := range []error{tc.cfg.Validate(), func() error { _, err := New(tc.cfg); return err }()} {
			var inv *fenceerr.InvalidError
			if !errors.As(err, &inv) || inv.Field != tc.field {
				t.Errorf("%+v: %v, want an InvalidError naming %s", tc.cfg, err, tc.field)
			}
		}
	}
	c := Config{Root: "r"}.WithDefaults()
	if c.DirMode != 0o755 || c.FileMode != 0o644 || c.HistoryLimit != DefaultHistoryLimit || c.Logger == nil || c.Now == nil {
		t.Fatalf("defaults = %+v", c)
	}
	nested := filepath.Join(t.TempDir(), "a", "b")
	a, err := New(Config{Root: nested})
	if err != nil {
		t.Fatal(err)
	}
	if a.Kind() != "file" {
		t.Fatalf("Kind = %q", a.Kind())
	}
	if _, ok, err := a.Published("nothing"); ok || err != nil {
		t.Fatalf("Published of nothing = %v %v", ok, err)
	}
}

func TestHistoryLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.HistoryLimit = 2 })
	for i := range int64(5) {
		execute(t, b.a, request("h", i+1, i+1, fmt.Sprint("k", i+1), fmt.Sprint(i+1)))
	}
	m := published(t, b.a, "h")
	if len(m.History) != 2 || m.History[0].Epoch != 3 || m.History[1].Epoch != 4 || m.Epoch != 5 {
		t.Fatalf("manifest = %+v", m)
	}
	if _, found := lookup(t, b.a, request("h", 2, 2, "k2", "2")); found {
		t.Fatal("found a key beyond the history limit")
	}
	if _, found := lookup(t, b.a, request("h", 3, 3, "k3", "3")); !found {
		t.Fatal("lost a key within the history limit")
	}
}

// A manifest damaged from outside: the fence cannot be read, so nothing is
// published over it and Lookup cannot answer.
func TestCorruptManifestIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	execute(t, b.a, request("f", 1, 1, "k1", "one\n"))
	if err := os.WriteFile(filepath.Join(b.root, ".f"+manifestSuffix), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := b.a.Execute(context.Background(), request("f", 2, 2, "k2", "two\n"))
	wantPermanent(t, err, nil)
	if _, found, err := b.a.Lookup(context.Background(), request("f", 1, 1, "k1", "one\n")); found || err == nil {
		t.Fatalf("Lookup over a corrupt manifest = %v, %v; want an error", found, err)
	}
	if got := readFile(t, filepath.Join(b.root, "f")); got != "one\n" {
		t.Fatalf("content = %q", got)
	}
}

// Someone replaces a published target by a directory or a symbolic link
// (inside or outside the root). The manifest beside it still records the
// publication, so a redelivery of its key — Lookup after a lost outcome,
// or Execute — is answered succeeded with the recorded result, as it is
// when the file was only removed; it used to be "not found" and then a
// permanent refusal, recording failed (effect none) a publication that
// happened. A new key is still refused, and a pending publication is not
// proven by the content a link leads to.
func TestPublishedKeyFoundAfterTargetReplaced(t *testing.T) {
	t.Parallel()
	outside := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(outside, []byte("B\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, replace := range map[string]func(t *testing.T, root, p string){
		"directory": func(t *testing.T, root, p string) {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
		},
		"symlink inside": func(t *testing.T, root, p string) {
			if err := os.WriteFile(filepath.Join(root, "d/copy"), []byte("B\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("copy", p); err != nil {
				t.Fatal(err)
			}
		},
		"symlink outside": func(t *testing.T, root, p string) {
			if err := os.Symlink(outside, p); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b34 := request("d/f", 34, 2, "k-b", "B\n")
			want := result(t, execute(t, b.a, b34))
			p := filepath.Join(b.root, "d/f")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			replace(t, b.root, p)

			out, found := lookup(t, b.a, b34)
			if !found {
				t.Fatal("Lookup: the published key is not found after its target was replaced")
			}
			if got := result(t, out); got != want {
				t.Fatalf("Lookup result = %+v, want %+v", got, want)
			}
			out, err := b.a.Execute(context.Background(), b34)
			if err != nil {
				t.Fatalf("Execute of the published key: %v", err)
			}
			if got := result(t, out); got != want {
				t.Fatalf("Execute result = %+v, want %+v", got, want)
			}
			// Another key is refused as before, and nothing is written.
			_, err = b.a.Execute(context.Background(), request("d/f", 35, 3, "k-c", "C\n"))
			wantPermanent(t, err, nil)
			if m := rawManifest(t, b.root, "d/f"); m.IdempotencyKey != "k-b" {
				t.Fatalf("manifest = %+v, want k-b's", m)
			}
			// A pending publication of B's content is not proven by a link
			// to (or a directory in place of) a file with that content.
			m := rawManifest(t, b.root, "d/f")
			m.State, m.IdempotencyKey = StatePending, "k-pending"
			loc, err := b.a.open("d/f", false, false)
			if err != nil {
				t.Fatal(err)
			}
			defer loc.close()
			if err := loc.writeManifest(m); err != nil {
				t.Fatal(err)
			}
			if _, found := lookup(t, b.a, request("d/f", 34, 4, "k-pending", "B\n")); found {
				t.Fatal("a pending publication was proven by what the replaced target leads to")
			}
		})
	}
}

// The root goes missing (its volume not mounted, moved away) after a
// publication: Lookup cannot answer (retryable), rather than "nothing
// published", which the runtime trusts as proof and executes again until
// the intent fails — while the publication comes back with the root. The
// old code answered not found.
func TestLookupWithoutTheRootCannotAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, target := range []string{"top", "d/f"} {
		req := request(target, 34, 2, "k-"+target, "B\n")
		execute(t, b.a, req)
		moved := b.root + ".moved"
		if err := os.Rename(b.root, moved); err != nil {
			t.Fatal(err)
		}
		_, found, err := b.a.Lookup(context.Background(), req)
		if found || !adapters.IsRetryable(err) {
			t.Fatalf("Lookup(%q) without the root = found %v, %v; want a retryable error", target, found, err)
		}
		if err := os.Rename(moved, b.root); err != nil {
			t.Fatal(err)
		}
		if _, found := lookup(t, b.a, req); !found {
			t.Fatalf("Lookup(%q) with the root back: not found", target)
		}
	}
}
