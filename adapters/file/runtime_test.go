package file_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// Integration scenarios: file intents through PostgreSQL, the dispatcher,
// JetStream and the runtime, published by the real file adapter.

const target = "out/report.txt"

func filePayload(content string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"target": target, "content": content})
	return b
}

func readTarget(t *testing.T, a *file.Adapter) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(a.Root(), target))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func manifest(t *testing.T, a *file.Adapter) file.Manifest {
	t.Helper()
	m, ok, err := a.Published(target)
	if err != nil || !ok {
		t.Fatalf("Published(%q) = %v, %v", target, ok, err)
	}
	return m
}

// rawManifest reads the manifest file as stored (Published resolves a
// pending state against the content).
func rawManifest(t *testing.T, a *file.Adapter) file.Manifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(a.Root(), "out", ".report.txt.fencegate.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m file.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	return m
}

func inode(t *testing.T, a *file.Adapter) uint64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(a.Root(), target))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// articleEnv: a runtime with a file adapter, the resource at epoch 33 (A's
// token). Intents use fence policy commit, so only the destination fences.
func articleEnv(t *testing.T) (*adaptertest.Env, *file.Adapter) {
	t.Helper()
	a := newAdapter(t, file.Config{Root: t.TempDir()})
	e := adaptertest.NewEnv(t, adaptertest.Options{Executors: []adapters.Executor{a}})
	e.Advance(t, 33)
	return e, a
}

func intent(e *adaptertest.Env, op, key, content string) outbox.Intent {
	in := e.Intent(file.Kind, op, key, filePayload(content))
	in.Fence = outbox.FenceCommit
	return in
}

// The article's scenario, B first: A decided at epoch 33 and paused; B took
// over at 34 and published. A's late publication is refused by the
// destination (superseded) and B's content stays.
func TestRuntimeArticleLateWriterSuperseded(t *testing.T) {
	t.Parallel()
	e, a := articleEnv(t)
	idA := e.EnqueueHeldBack(t, intent(e, "A-run", "report/A", "A's report\n")) // A pauses
	e.Advance(t, 34)
	idB := e.Enqueue(t, intent(e, "B-run", "report/B", "B's report\n"))
	recB := e.WaitStatus(t, idB, outbox.StatusSucceeded)
	e.Release(t, idA) // A wakes up
	recA := e.WaitStatus(t, idA, outbox.StatusSuperseded)

	var sup file.SupersededResult
	if err := json.Unmarshal(recA.Result, &sup); err != nil || sup.RejectedEpoch != 33 || sup.CurrentEpoch != 34 || sup.CurrentIntentID != idB {
		t.Fatalf("A's result = %s (%v); want rejected 33, current 34 by intent %d", recA.Result, err, idB)
	}
	if got := readTarget(t, a); got != "B's report\n" {
		t.Fatalf("content = %q, want B's", got)
	}
	if m := manifest(t, a); m.Epoch != 34 || m.IntentID != idB || len(m.History) != 0 {
		t.Fatalf("manifest = %+v; want B's publication only", m)
	}
	var res file.Result
	if err := json.Unmarshal(recB.Result, &res); err != nil || res.Epoch != 34 || res.Path != target {
		t.Fatalf("B's result = %s", recB.Result)
	}
}

// A first: A publishes at 33, B at 34 replaces it.
func TestRuntimeArticleNewerWriterReplaces(t *testing.T) {
	t.Parallel()
	e, a := articleEnv(t)
	idA := e.Enqueue(t, intent(e, "A-run", "report/A", "A's report\n"))
	e.WaitStatus(t, idA, outbox.StatusSucceeded)
	if got := readTarget(t, a); got != "A's report\n" {
		t.Fatalf("content = %q, want A's", got)
	}
	e.Advance(t, 34)
	idB := e.Enqueue(t, intent(e, "B-run", "report/B", "B's report\n"))
	e.WaitStatus(t, idB, outbox.StatusSucceeded)
	if got := readTarget(t, a); got != "B's report\n" {
		t.Fatalf("content = %q, want B's", got)
	}
	m := manifest(t, a)
	if m.Epoch != 34 || m.IntentID != idB || len(m.History) != 1 || m.History[0].IntentID != idA {
		t.Fatalf("manifest = %+v; want B's publication after A's", m)
	}
}

// Environment of the helper process TestRuntimeHelperProcess.
const (
	helperDB   = "FENCEGATE_RUNTIME_HELPER_DB"
	helperNATS = "FENCEGATE_RUNTIME_HELPER_NATS"
	helperRoot = "FENCEGATE_RUNTIME_HELPER_ROOT"
)

// crashRuntimeConfig is the runtime configuration of both the crashing
// process and the one that takes over: redelivery after 3 s without an
// ack.
func crashRuntimeConfig() executor.Config {
	return executor.Config{ExecuteTimeout: 2 * time.Second, AckWait: 3 * time.Second}
}

const crashLockTimeout = 1500 * time.Millisecond

// TestRuntimeHelperProcess is the gateway process TestRuntimeKilledAfterRename
// kills: a runtime with a file adapter that exits (status 3) right after the
// content rename, before the manifest is marked and the outcome recorded.
func TestRuntimeHelperProcess(t *testing.T) {
	dbURL := os.Getenv(helperDB)
	if dbURL == "" {
		t.Skip("helper process for TestRuntimeKilledAfterRename")
	}
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
		os.Exit(1)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		fail("pool: %v", err)
	}
	nc, err := nats.Connect(os.Getenv(helperNATS))
	if err != nil {
		fail("nats: %v", err)
	}
	store, err := idempotency.New(pool, idempotency.Config{Schema: testdb.Schema(), LockTimeout: crashLockTimeout})
	if err != nil {
		fail("store: %v", err)
	}
	client, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema()})
	if err != nil {
		fail("outbox: %v", err)
	}
	a, err := file.New(file.Config{Root: os.Getenv(helperRoot), AfterRename: func(string) { os.Exit(3) }})
	if err != nil {
		fail("adapter: %v", err)
	}
	cfg := crashRuntimeConfig()
	cfg.Executors = []adapters.Executor{a}
	rt, err := executor.NewRuntime(pool, nc, store, client, cfg)
	if err != nil {
		fail("runtime: %v", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := rt.Start(sctx); err != nil {
		fail("start: %v", err)
	}
	// Wait to be killed by the hook; the parent gives up first otherwise.
	<-time.After(30 * time.Second)
	fail("the intent was never executed")
}

// The gateway process dies between the content rename and recording the
// outcome (a real process exit, so the manifest stays "pending"). The
// redelivery, in another runtime, looks the publication up and records
// success: the file is not published twice (same inode, same manifest) and
// the intent ends succeeded.
func TestRuntimeKilledAfterRename(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	e := adaptertest.NewEnv(t, adaptertest.Options{LockTimeout: crashLockTimeout})
	id := e.Enqueue(t, e.Intent(file.Kind, "B-run", "report/B", filePayload("B's report\n")))

	ctx, cancel := context.WithTimeout(context.Background(), adaptertest.WaitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRuntimeHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperDB+"="+e.DBURL, helperNATS+"="+e.NATSURL, helperRoot+"="+root)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("helper process: %v, want exit status 3 (killed after the rename); output:\n%s", err, out)
	}

	a := newAdapter(t, file.Config{Root: root})
	stored := rawManifest(t, a)
	if stored.State != file.StatePending || stored.IntentID != id {
		t.Fatalf("manifest after the kill = %+v; want intent %d pending", stored, id)
	}
	if got := readTarget(t, a); got != "B's report\n" {
		t.Fatalf("content after the kill = %q", got)
	}
	ino := inode(t, a)
	if rec := e.Get(t, id); rec.Status.Terminal() {
		t.Fatalf("intent recorded although its process died first: %s", adaptertest.Describe(rec))
	}

	ex := adaptertest.NewCounting(a)
	e.StartRuntime(t, crashRuntimeConfig(), ex)
	rec := e.WaitStatus(t, id, outbox.StatusSucceeded)
	var res file.Result
	if err := json.Unmarshal(rec.Result, &res); err != nil || res.IntentID != id || !res.PublishedAt.Equal(stored.PublishedAt) {
		t.Fatalf("result = %s (%v); want the killed attempt's publication", rec.Result, err)
	}
	if n := ex.Calls(rec.IdempotencyKey); n != 0 {
		t.Fatalf("the redelivery executed %d times; want it found by lookup", n)
	}
	if got := inode(t, a); got != ino {
		t.Fatal("the file was replaced: published twice")
	}
	if m := rawManifest(t, a); !reflect.DeepEqual(m.Publication, stored.Publication) || len(m.History) != 0 {
		t.Fatalf("manifest after recovery = %+v; want the killed attempt's publication, no history", m)
	}
	if got := readTarget(t, a); got != "B's report\n" {
		t.Fatalf("content = %q", got)
	}
}

// The runtime crashes after B's publication and before recording it, and
// the resource moves on (epoch 35) before the redelivery. B's content was
// published, so B is succeeded — found by lookup — not superseded, and the
// file is not touched again.
func TestRuntimeCrashThenResourceMovesOn(t *testing.T) {
	t.Parallel()
	a := newAdapter(t, file.Config{Root: t.TempDir()})
	e := adaptertest.NewEnv(t, adaptertest.Options{LockTimeout: crashLockTimeout})
	e.Advance(t, 34)
	ex := adaptertest.NewCounting(a)
	p := e.StartCrashingProcess(t, crashRuntimeConfig(), ex)
	id := e.Enqueue(t, e.Intent(file.Kind, "B-run", "report/B", filePayload("B's report\n")))
	p.WaitCrashed(t)
	ino := inode(t, a)
	stored := rawManifest(t, a)
	e.Advance(t, 35) // C takes over before B's redelivery

	e.StartRuntime(t, crashRuntimeConfig(), ex)
	rec := e.WaitStatus(t, id, outbox.StatusSucceeded)
	var res file.Result
	if err := json.Unmarshal(rec.Result, &res); err != nil || res.IntentID != id || res.Epoch != 34 {
		t.Fatalf("result = %s (%v); want B's publication", rec.Result, err)
	}
	if n := ex.Calls(rec.IdempotencyKey); n != 1 {
		t.Fatalf("Execute ran %d times; want once, before the crash", n)
	}
	if got := inode(t, a); got != ino {
		t.Fatal("the file was replaced")
	}
	if m := rawManifest(t, a); !reflect.DeepEqual(m.Publication, stored.Publication) {
		t.Fatalf("manifest = %+v, want %+v", m.Publication, stored.Publication)
	}
	if k := e.Key(t, file.Kind, rec.IdempotencyKey); k == nil || k.State != idempotency.StateCompleted {
		t.Fatalf("key = %+v; want completed", k)
	}
}

// The runtime crashes after B's publication and before recording it, and
// someone replaces the file by a directory before the redelivery. The
// manifest still records B's publication: the redelivery finds it and
// records succeeded, without executing again. (It was looked up as "not
// found", executed after the settle window and recorded failed, effect
// none.)
func TestRuntimeCrashThenTargetReplaced(t *testing.T) {
	t.Parallel()
	a := newAdapter(t, file.Config{Root: t.TempDir()})
	e := adaptertest.NewEnv(t, adaptertest.Options{LockTimeout: crashLockTimeout})
	ex := adaptertest.NewCounting(a)
	cfg := crashRuntimeConfig()
	cfg.LookupSettle = time.Second
	p := e.StartCrashingProcess(t, cfg, ex)
	id := e.Enqueue(t, e.Intent(file.Kind, "B-run", "report/B", filePayload("B's report\n")))
	p.WaitCrashed(t)
	path := filepath.Join(a.Root(), target)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}

	e.StartRuntime(t, cfg, ex)
	rec := e.WaitStatus(t, id, outbox.StatusSucceeded)
	var res file.Result
	if err := json.Unmarshal(rec.Result, &res); err != nil || res.IntentID != id {
		t.Fatalf("result = %s (%v); want B's publication", rec.Result, err)
	}
	if n := ex.Calls(rec.IdempotencyKey); n != 1 {
		t.Fatalf("Execute ran %d times; want once, before the crash", n)
	}
}
