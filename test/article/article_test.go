package article

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/internal/failpoint"
	ft "github.com/fencegate/fencegate/internal/testkit/faulttest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
	"github.com/fencegate/fencegate/internal/testkit/smtptest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/migrations"
)

// env is one test's services and binary.
type env struct {
	t   *testing.T
	bin string
	db  string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return &env{t: t, bin: ft.Gateway(t), db: testdb.NewURL(t)}
}

func (e *env) gw(fp string, args ...string) ft.Result {
	e.t.Helper()
	var extra []string
	if fp != "" {
		extra = []string{failpoint.EnvVar + "=" + fp}
	}
	return ft.Gw(e.t, e.bin, e.db, extra, args...)
}

func (e *env) start(fp string, args ...string) *ft.Proc {
	e.t.Helper()
	var extra []string
	if fp != "" {
		extra = []string{failpoint.EnvVar + "=" + fp}
	}
	return ft.Start(e.t, e.bin, e.db, extra, args...)
}

// run starts `gateway run` with fast relay settings.
func (e *env) run(fp, natsURL string, args ...string) *ft.Proc {
	e.t.Helper()
	base := []string{"run", "--nats-url", natsURL, "--poll-interval", "100ms",
		"--relay-timeout", "2s", "--claim-ttl", "5s", "--publish-timeout", "3s", "--log-level", "debug",
		// An attempt cut off by a restart (its outcome not recorded) is
		// recovered by lookup once its key's lock expires.
		"--execute-timeout", "4s", "--idempotency-lock-timeout", "10s",
		// ... and its message is delivered again 8 s after its delivery
		// (twice the execute timeout), not after the default minute.
		"--ack-wait", "8s",
		// A lookup that finds nothing is proof after 3 s instead of 10 min:
		// Mailpit stores a message before it answers the final dot, and the
		// file manifest is written before the rename, so both show an
		// effect at once.
		"--lookup-settle", "3s",
		// The mail policy: the tests' senders.
		"--mail-from-allow", "example.com"}
	return e.start(fp, append(base, args...)...)
}

func (e *env) pool() *pgxpool.Pool {
	e.t.Helper()
	p, err := pgxpool.New(context.Background(), e.db)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	return p
}

// waitTerminal polls `gateway status` until the intent leaves pending and
// relayed and returns the status object.
func (e *env) waitTerminal(id int64, timeout time.Duration) map[string]any {
	e.t.Helper()
	var last ft.Result
	ft.Poll(e.t, timeout, fmt.Sprintf("intent %d to reach a terminal status", id), func() (bool, string) {
		last = e.gw("", "status", strconv.FormatInt(id, 10))
		s, _ := last.Obj["status"].(string)
		return last.Code == 0 && s != "pending" && s != "relayed", last.Stdout
	})
	return last.Obj
}

// waitKilled waits for a crash failpoint to kill p and checks it fired.
func waitKilled(t *testing.T, p *ft.Proc, point string, timeout time.Duration) {
	t.Helper()
	r, err := p.Wait(timeout)
	if err != nil {
		t.Fatalf("waiting for failpoint %s to crash the process: %v", point, err)
	}
	if !r.Killed || !strings.Contains(r.Stderr, "failpoint: "+point+": crash") {
		t.Fatalf("process did not crash at %s: exit %d killed=%v\n%s", point, r.Code, r.Killed, r.Stderr)
	}
}

// 1. Pause A after it acquires and before it writes; let the lease expire;
// B acquires a newer epoch and publishes; resume A: A's write is rejected
// at the destination, B's result stays.
func TestArticle1PausedHolderIsFencedOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ns := natstest.StartProcess(t)
	root := t.TempDir()
	e.run("", ns.URL, "--adapters", "file", "--file-root", root)

	// A acquires epoch 1 and pauses (SIGSTOP on itself) before it can even
	// print the epoch: the worker that stalls right after taking the lock.
	const ttl = 500 * time.Millisecond
	a := e.start(failpoint.AfterLeaseAcquire+"=pause", "lease", "acquire", "--resource", "report", "--holder", "A", "--ttl", ttl.String())
	if err := a.WaitStopped(time.Minute); err != nil {
		t.Fatal(err)
	}
	// The pause outlives the lease: this sleep is the fault.
	time.Sleep(ttl + 200*time.Millisecond)

	b := e.gw("", "lease", "acquire", "--resource", "report", "--holder", "B", "--ttl", "60s")
	ft.Expect(t, b, 0, "")
	if b.Int("epoch") != 2 {
		t.Fatalf("B acquired %s, want epoch 2", b.Stdout)
	}
	r := e.gw("", "enqueue", "--resource", "report", "--epoch", "2", "--op", "B-publish", "--kind", "file",
		"--payload", `{"target":"report.txt","content":"report by B"}`)
	ft.Expect(t, r, 0, "")
	if st := e.waitTerminal(r.Int("intent_id"), time.Minute); st["status"] != "succeeded" {
		t.Fatalf("B's publication ended %v", st)
	}

	// A resumes, still believing it holds epoch 1, and writes.
	a.Resume()
	ar, err := a.Wait(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ft.Expect(t, ar, 0, "")
	if ar.Int("epoch") != 1 {
		t.Fatalf("A's acquire answered %s, want epoch 1", ar.Stdout)
	}
	for _, fence := range []string{"commit", "execute"} {
		late := e.gw("", "enqueue", "--resource", "report", "--epoch", "1", "--op", "A-publish-"+fence, "--kind", "file",
			"--fence", fence, "--payload", `{"target":"report.txt","content":"stale report by A"}`)
		ft.Expect(t, late, 3, "stale_epoch")
	}
	// A's renewal is refused too.
	if rn := e.gw("", "lease", "renew", "--resource", "report", "--holder", "A", "--epoch", "1", "--ttl", "10s"); rn.Code == 0 {
		t.Fatalf("A renewed its expired, superseded lease: %s", rn.Stdout)
	}
	if st := e.gw("", "status", "--resource", "report", "--op", "A-publish-commit"); st.Code != 2 {
		t.Fatalf("A's rejected write left an intent: %s", st.Stdout)
	}
	if got, err := os.ReadFile(filepath.Join(root, "report.txt")); err != nil || string(got) != "report by B" {
		t.Fatalf("report.txt = %q, %v; want B's result", got, err)
	}
}

// 2a. Pause between the epoch check and the insert (inside
// fencegate_enqueue, with the control row locked): a takeover waits for
// the enqueue to commit, so the intent committed while its epoch was
// current, and nothing stale slips in after.
func TestArticle2PauseBetweenCheckAndInsert(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool := e.pool()
	ctx := context.Background()
	// The failpoint lives in the version of fencegate_enqueue migration
	// 00010 created and 00015 replaced: installed again in this test's
	// database only (production has none).
	installFailpointEnqueue(t, pool)
	ft.Expect(t, e.gw("", "lease", "acquire", "--resource", "r", "--holder", "A", "--ttl", "300ms"), 0, "")

	// The test holds the failpoint's advisory lock: A's enqueue stops
	// after its epoch check passed.
	hold, err := pgx.Connect(ctx, e.db)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close(ctx)
	if _, err := hold.Exec(ctx, `SELECT pg_advisory_lock($1)`, failpoint.BetweenCheckAndInsertLock); err != nil {
		t.Fatal(err)
	}
	fpURL := e.db + sep(e.db) + "fencegate.failpoint=" + failpoint.BetweenCheckAndInsert
	a := ft.Start(t, e.bin, fpURL, nil, "enqueue", "--resource", "r", "--epoch", "1", "--op", "A-1", "--kind", "email",
		"--payload", `{"to":"a@example.com","from":"w@example.com","subject":"s","text":"by A"}`)
	ft.Poll(t, time.Minute, "A's enqueue to wait at the failpoint", func() (bool, string) {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n)
		return n == 1, fmt.Sprintf("%d waiting advisory locks; A exited=%v %s", n, a.Exited(), a.Stderr())
	})
	// A's lease expires while A is paused inside the transaction. The sleep
	// is the fault.
	time.Sleep(400 * time.Millisecond)
	// --lock-timeout well above this test's pause: B's takeover waits for
	// A rather than giving up as busy (the default bound is 5s).
	b := ft.Start(t, e.bin, e.db, nil, "lease", "acquire", "--resource", "r", "--holder", "B", "--ttl", "60s", "--lock-timeout", "2m")
	// B's takeover must wait for the control row A's enqueue holds.
	ft.Poll(t, time.Minute, "B's takeover to wait on A's row lock", func() (bool, string) {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event <> 'advisory'`).Scan(&n)
		return n >= 1 || b.Exited(), fmt.Sprintf("%d waiting on row locks", n)
	})
	if b.Exited() {
		r, _ := b.Wait(time.Second)
		t.Fatalf("B's takeover finished while A's enqueue held the control row: %s", r.Stdout)
	}
	if _, err := hold.Exec(ctx, `SELECT pg_advisory_unlock($1)`, failpoint.BetweenCheckAndInsertLock); err != nil {
		t.Fatal(err)
	}
	ar, err := a.Wait(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ft.Expect(t, ar, 0, "")
	br, err := b.Wait(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ft.Expect(t, br, 0, "")
	if ar.Obj["status"] != "pending" || br.Int("epoch") != 2 {
		t.Fatalf("A: %s; B: %s; want A inserted at epoch 1, then B at epoch 2", ar.Stdout, br.Stdout)
	}
	// Commit order: A's intent committed before B's grant.
	var intentTS, grantTS time.Time
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT pg_xact_commit_timestamp(xmin) FROM fencegate.intents WHERE operation_id = 'A-1'`)).Scan(&intentTS); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT pg_xact_commit_timestamp(xmin) FROM fencegate.resources WHERE resource_id = 'r'`)).Scan(&grantTS); err != nil {
		t.Fatal(err)
	}
	if !intentTS.Before(grantTS) {
		t.Fatalf("A's intent committed at %s, not before B's grant at %s", intentTS, grantTS)
	}
	// Nothing stale slips in after the takeover.
	ft.Expect(t, e.gw("", "enqueue", "--resource", "r", "--epoch", "1", "--op", "A-2", "--kind", "email",
		"--payload", `{"to":"a@example.com","from":"w@example.com","subject":"s","text":"late"}`), 3, "stale_epoch")
}

func sep(u string) string {
	if strings.Contains(u, "?") {
		return "&"
	}
	return "?"
}

// 2b. Pause (and crash) between applying and answering: the commit stands,
// the takeover is not blocked by it, and a retry of the same operation id
// returns the recorded result, even after the takeover; different content
// under the same operation id is never stored.
func TestArticle2PauseAndCrashBetweenApplyAndAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ft.Expect(t, e.gw("", "lease", "acquire", "--resource", "r", "--holder", "A", "--ttl", "300ms"), 0, "")
	payload := `{"to":"a@example.com","from":"w@example.com","subject":"s","text":"by A"}`
	enq := []string{"enqueue", "--resource", "r", "--epoch", "1", "--op", "A-1", "--kind", "email", "--payload", payload}

	// Pause after the commit, before the answer.
	a := e.start(failpoint.AfterCommitBeforeAnswer+"=pause", enq...)
	if err := a.WaitStopped(time.Minute); err != nil {
		t.Fatal(err)
	}
	st := e.gw("", "status", "--resource", "r", "--op", "A-1")
	ft.Expect(t, st, 0, "")
	id := st.Int("intent_id")
	time.Sleep(400 * time.Millisecond) // A's lease expires while it is paused: the fault
	b := e.gw("", "lease", "acquire", "--resource", "r", "--holder", "B", "--ttl", "60s")
	ft.Expect(t, b, 0, "")
	if b.Int("epoch") != 2 {
		t.Fatalf("B: %s", b.Stdout)
	}
	a.Resume()
	ar, err := a.Wait(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ft.Expect(t, ar, 0, "")
	if ar.Int("intent_id") != id || ar.Obj["duplicate"] != false {
		t.Fatalf("A's late answer %s, want intent %d, not a duplicate", ar.Stdout, id)
	}
	// The retry of the same operation id (same content) returns the
	// recorded intent, though epoch 1 is no longer current.
	retry := e.gw("", enq...)
	ft.Expect(t, retry, 0, "")
	if retry.Int("intent_id") != id || retry.Obj["duplicate"] != true {
		t.Fatalf("retry = %s, want the recorded intent %d as a duplicate", retry.Stdout, id)
	}

	// Crash after the commit, before the answer (the response is lost).
	ft.Expect(t, e.gw("", "lease", "renew", "--resource", "r", "--holder", "B", "--epoch", "2", "--ttl", "60s"), 0, "")
	enqB := []string{"enqueue", "--resource", "r", "--epoch", "2", "--op", "B-1", "--kind", "email", "--payload", payload}
	crashed := e.start(failpoint.AfterCommitBeforeAnswer+"=crash", enqB...)
	waitKilled(t, crashed, failpoint.AfterCommitBeforeAnswer, time.Minute)
	// Authority moves on (an external advance), then B retries its lost
	// enqueue.
	ft.Expect(t, e.gw("", "epoch", "advance", "--resource", "r", "--epoch", "3"), 0, "")
	again := e.gw("", enqB...)
	ft.Expect(t, again, 0, "")
	if again.Obj["duplicate"] != true || again.Int("intent_id") < 1 {
		t.Fatalf("retry after the lost response = %s, want the recorded intent", again.Stdout)
	}
	// Same operation id, different content: a conflict, never stored.
	conflict := e.gw("", "enqueue", "--resource", "r", "--epoch", "2", "--op", "B-1", "--kind", "email",
		"--payload", `{"to":"evil@example.com","from":"w@example.com","subject":"s","text":"other"}`)
	ft.Expect(t, conflict, 5, "conflict")
	// A new operation at an old epoch: stale.
	ft.Expect(t, e.gw("", "enqueue", "--resource", "r", "--epoch", "2", "--op", "B-2", "--kind", "email", "--payload", payload), 3, "stale_epoch")
	var n int
	if err := e.pool().QueryRow(context.Background(), testdb.SQL(`SELECT count(*) FROM fencegate.intents`)).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d intents stored (%v), want 2 (A-1, B-1)", n, err)
	}
}

// expireAbandoned stands in for waiting out the idempotency lock timeout
// (10 s here, --idempotency-lock-timeout) once the process that owned a key
// is dead: the key's lock expires now, so the redelivery treats the attempt
// as abandoned at once. Only keys whose owner is known dead are touched.
func expireAbandoned(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(),
		testdb.SQL(`UPDATE fencegate.idempotency_keys SET locked_until = now() - interval '1 second' WHERE state = 'started'`)); err != nil {
		t.Fatal(err)
	}
}

// recover runs a gateway again after a crash (its abandoned keys expired
// at once: expireAbandoned) and waits for intent id to succeed; it returns
// the intent's status.
func (e *env) recover(id int64, natsURL string, args ...string) map[string]any {
	e.t.Helper()
	expireAbandoned(e.t, e.pool())
	e.run("", natsURL, args...)
	st := e.waitTerminal(id, 2*time.Minute)
	if st["status"] != "succeeded" {
		e.t.Fatalf("intent ended %v", st)
	}
	return st
}

// 3. Crash the adapter after the external effect and before recording it:
// the redelivery looks the result up and does not execute again.
func TestArticle3CrashAfterEffectBeforeRecord(t *testing.T) {
	t.Parallel()
	t.Run("email", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ns := natstest.StartProcess(t)
		mp := smtptest.StartMailpit(t)
		const domain = "article3.fencegate.test"
		args := []string{"--adapters", "email", "--smtp-addr", mp.SMTPAddr, "--mail-lookup", "mailpit",
			"--mailpit-url", mp.BaseURL, "--mail-domain", domain}
		p := e.run(failpoint.AfterEffectBeforeRecord+"=crash", ns.URL, args...)
		ft.Expect(t, e.gw("", "lease", "acquire", "--resource", "r", "--holder", "A", "--ttl", "60s"), 0, "")
		const key = "nightly/2026-12-01/alice"
		r := e.gw("", "enqueue", "--resource", "r", "--epoch", "1", "--op", "mail-1", "--kind", "email", "--key", key,
			"--payload", `{"to":"alice@example.com","from":"reports@example.com","subject":"Nightly","text":"hi"}`)
		ft.Expect(t, r, 0, "")
		waitKilled(t, p, failpoint.AfterEffectBeforeRecord, 2*time.Minute)
		msgID := email.MessageID(key, domain)
		count := func() int {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			n, err := mp.CountMessageID(ctx, msgID)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := count(); n != 1 {
			t.Fatalf("after the crash Mailpit holds %d messages %s, want 1 (the effect happened)", n, msgID)
		}
		st := e.recover(r.Int("intent_id"), ns.URL, args...)
		if res, _ := st["result"].(map[string]any); res["message_id"] != msgID {
			t.Fatalf("result %v, want message_id %s", st["result"], msgID)
		}
		if n := count(); n != 1 {
			t.Fatalf("after recovery Mailpit holds %d messages %s, want exactly 1", n, msgID)
		}
	})
	for _, point := range []string{failpoint.AfterEffectBeforeRecord, failpoint.AfterRenameBeforeRecord} {
		t.Run("file/"+point, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ns := natstest.StartProcess(t)
			root := t.TempDir()
			args := []string{"--adapters", "file", "--file-root", root}
			p := e.run(point+"=crash", ns.URL, args...)
			ft.Expect(t, e.gw("", "lease", "acquire", "--resource", "r", "--holder", "A", "--ttl", "60s"), 0, "")
			r := e.gw("", "enqueue", "--resource", "r", "--epoch", "1", "--op", "file-1", "--kind", "file",
				"--payload", `{"target":"out/report.txt","content":"v1"}`)
			ft.Expect(t, r, 0, "")
			waitKilled(t, p, point, 2*time.Minute)
			if b, err := os.ReadFile(filepath.Join(root, "out/report.txt")); err != nil || string(b) != "v1" {
				t.Fatalf("after the crash the target holds %q, %v; want the published v1", b, err)
			}
			e.recover(r.Int("intent_id"), ns.URL, args...)
			// One publication: the manifest's current entry, no second
			// history entry for the same key, and the recovery logged no
			// second publish.
			pubs := publications(t, root, "out/report.txt", "r/file-1")
			if pubs != 1 {
				t.Fatalf("%d publications of the key recorded, want 1", pubs)
			}
		})
	}
}

// publications counts the publications of key the file adapter's
// manifest records for target (the current one and its history).
func publications(t *testing.T, root, target, key string) int {
	t.Helper()
	a, err := file.New(file.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	m, ok, err := a.Published(target)
	if err != nil || !ok {
		t.Fatalf("manifest of %s: found=%v, %v", target, ok, err)
	}
	n := 0
	if m.IdempotencyKey == key {
		n++
	}
	for _, p := range m.History {
		if p.IdempotencyKey == key {
			n++
		}
	}
	return n
}

// 4. Restart PostgreSQL (issuer and destination) and NATS mid-run: epochs
// never go back, every committed intent still reaches a terminal status,
// effects are still found by lookup.
func TestArticle4RestartPostgresAndNATS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// fsync on: these tests make claims about crashes and restarts.
	cl, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true})
	if err != nil {
		t.Fatalf("start a PostgreSQL of our own (it is restarted): %v", err)
	}
	t.Cleanup(func() { _ = cl.Stop() })
	e := &env{t: t, bin: ft.Gateway(t), db: cl.URL("postgres")}
	ft.Expect(t, e.gw("", "migrate"), 0, "")
	ns := natstest.StartProcess(t)
	mp := smtptest.StartMailpit(t)
	root := t.TempDir()
	const domain = "article4.fencegate.test"
	args := []string{"--adapters", "email,file", "--file-root", root, "--smtp-addr", mp.SMTPAddr,
		"--mail-lookup", "mailpit", "--mailpit-url", mp.BaseURL, "--mail-domain", domain}
	e.run("", ns.URL, args...)

	epoch := int64(0)
	var ids []int64
	round := func(n int) {
		t.Helper()
		r := e.gw("", "lease", "acquire", "--resource", "r", "--holder", fmt.Sprintf("w%d", n), "--ttl", "50ms")
		for r.Code == 4 { // lease_held: wait out the short lease
			time.Sleep(60 * time.Millisecond)
			r = e.gw("", "lease", "acquire", "--resource", "r", "--holder", fmt.Sprintf("w%d", n), "--ttl", "50ms")
		}
		ft.Expect(t, r, 0, "")
		if r.Int("epoch") <= epoch {
			t.Fatalf("round %d: epoch %d after %d: the issuer went back", n, r.Int("epoch"), epoch)
		}
		epoch = r.Int("epoch")
		ep := strconv.FormatInt(epoch, 10)
		m := e.gw("", "enqueue", "--resource", "r", "--epoch", ep, "--op", fmt.Sprintf("mail-%d", n), "--kind", "email",
			"--key", fmt.Sprintf("k/%d", n%3),
			"--payload", fmt.Sprintf(`{"to":"x@example.com","from":"w@example.com","subject":"s%d","text":"t"}`, n%3))
		ft.Expect(t, m, 0, "")
		f := e.gw("", "enqueue", "--resource", "r", "--epoch", ep, "--op", fmt.Sprintf("file-%d", n), "--kind", "file",
			"--payload", fmt.Sprintf(`{"target":"r.txt","content":"epoch %d"}`, epoch))
		ft.Expect(t, f, 0, "")
		ids = append(ids, m.Int("intent_id"), f.Int("intent_id"))
	}
	for n := range 3 {
		round(n)
	}
	if err := cl.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for n := 3; n < 6; n++ {
		round(n)
	}
	ns.Kill()
	for n := 6; n < 9; n++ {
		round(n) // commits while NATS is down
	}
	ns.Restart()
	if err := cl.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := cl.StartAgain(ctx); err != nil {
		t.Fatal(err)
	}
	for n := 9; n < 12; n++ {
		round(n)
	}
	for _, id := range ids {
		st := e.waitTerminal(id, 3*time.Minute)
		// A file intent (fence execute) whose resource moved on before it
		// ran is superseded, never executed: terminal too.
		if st["status"] != "succeeded" && !(st["kind"] == "file" && st["status"] == "superseded") {
			t.Fatalf("intent %d ended %v", id, st)
		}
	}
	for k := range 3 {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := mp.CountMessageID(ctx, email.MessageID(fmt.Sprintf("k/%d", k), domain))
		cancel()
		if err != nil || n != 1 {
			t.Fatalf("business key k/%d: %d messages (%v), want exactly 1", k, n, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "r.txt")); err != nil || string(b) != fmt.Sprintf("epoch %d", epoch) {
		t.Fatalf("r.txt = %q, %v; want the last epoch's %d content", b, err, epoch)
	}
}

// installFailpointEnqueue replaces fencegate_enqueue in the test schema
// with failpointEnqueueSQL's, notifying the schema's channel, and pins its
// search_path again as migrations.Up does.
func installFailpointEnqueue(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	fn := strings.ReplaceAll(failpointEnqueueSQL(t), "'fencegate_intents'", "current_schema() || '_intents'")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, testdb.Schema()+", pg_temp"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, fn)
		return err
	})
	if err == nil {
		// Migration 00010's body names the tables unqualified: it reads
		// them through a search_path of the schema (fencegate's own
		// functions search the catalog alone and qualify every name).
		_, err = pool.Exec(ctx, "ALTER FUNCTION "+testdb.Schema()+
			".fencegate_enqueue(text, bigint, text, text, text, text, jsonb, boolean) SET search_path = "+testdb.Schema()+", pg_temp")
	}
	if err != nil {
		t.Fatalf("install the failpoint version of fencegate_enqueue: %v", err)
	}
}

// failpointEnqueueSQL is the CREATE FUNCTION of migration 00010's Up: the
// fencegate_enqueue with the between_check_and_insert failpoint.
func failpointEnqueueSQL(t *testing.T) string {
	t.Helper()
	b, err := fs.ReadFile(migrations.FS(), "00010_failpoints.sql")
	if err != nil {
		t.Fatal(err)
	}
	up, _, _ := strings.Cut(string(b), "-- +goose Down")
	_, fn, ok := strings.Cut(up, "-- +goose StatementBegin")
	fn, _, ok2 := strings.Cut(fn, "-- +goose StatementEnd")
	if !ok || !ok2 || !strings.Contains(fn, "fencegate.failpoint") {
		t.Fatal("migration 00010 no longer holds the failpoint version of fencegate_enqueue")
	}
	return fn
}
