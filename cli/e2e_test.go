package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/smtptest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// waitStatus polls `gateway status ID` until the intent reaches a terminal
// status, and fails unless it is want. It returns the status object.
func waitStatus(t *testing.T, dbURL string, id any, want string) map[string]any {
	t.Helper()
	var last cliResult
	pollUntil(t, 60*time.Second, "intent "+jsonNum(id)+" to become "+want, func() (bool, string) {
		last = gw(t, dbURL, "status", jsonNum(id))
		if last.code != 0 {
			t.Fatalf("gateway status %s: exit %d: %s", jsonNum(id), last.code, last.stdout)
		}
		switch last.obj["status"] {
		case "pending", "relayed":
			time.Sleep(50 * time.Millisecond) // each poll is a process; don't spin
			return false, last.stdout
		}
		return true, last.stdout
	})
	if last.obj["status"] != want {
		t.Fatalf("intent %s ended %v, want %s: %s", jsonNum(id), last.obj["status"], want, last.stdout)
	}
	return last.obj
}

// enqueue runs `gateway enqueue` and returns the new intent's id.
func enqueue(t *testing.T, dbURL string, args ...string) any {
	t.Helper()
	r := gw(t, dbURL, append([]string{"enqueue"}, args...)...)
	expectCode(t, r, 0, "")
	if r.obj["duplicate"] != false || r.obj["intent_id"] == nil {
		t.Fatalf("enqueue %v = %s", args, r.stdout)
	}
	return r.obj["intent_id"]
}

func resultOf(t *testing.T, status map[string]any) map[string]any {
	t.Helper()
	res, ok := status["result"].(map[string]any)
	if !ok {
		t.Fatalf("status has no result object: %v", status)
	}
	return res
}

func countMessageID(t *testing.T, mp *smtptest.Mailpit, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := mp.CountMessageID(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func sha256Of(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// The whole path, as processes, the way an operator runs it: a migrated
// database, a nats-server process, Mailpit, and `gateway run` with both
// adapters; a worker's lease, epoch and enqueues through the CLI; the
// outcomes through `gateway status`. Then the cross-epoch guarantees: the
// same business key from a newer epoch is not sent twice, and a stale file
// intent is fenced out at the destination. SIGTERM ends it with exit 0.
func TestRunEndToEnd(t *testing.T) {
	t.Parallel()
	start := time.Now()
	db, pool := runPool(t)
	expectCode(t, gw(t, db, "migrate"), 0, "")
	ns := natstest.StartProcess(t)
	mp := smtptest.StartMailpit(t)
	root := t.TempDir()
	const domain = "e2e.fencegate.test"

	p := startRun(t, nil, db, ns.URL,
		"--mail-lookup", "mailpit", "--mailpit-url", mp.BaseURL,
		"--smtp-addr", mp.SMTPAddr, "--mail-domain", domain,
		"--file-root", root, "--poll-interval", "200ms")

	// Worker A takes the lease and enqueues one email and one file.
	if epoch := acquireLease(t, db, "report"); epoch != "1" {
		t.Fatalf("acquire: epoch %s, want 1", epoch)
	}
	const mailKey = "report/2026-12-01/alice"
	const mailPayload = `{"to":"alice@example.com","from":"reports@example.com","subject":"Nightly report","text":"attached"}`
	const target = "reports/2026-12-01.txt"
	mailID := enqueue(t, db, "--resource", "report", "--epoch", "1", "--op", "mail-1", "--kind", "email",
		"--key", mailKey, "--payload", mailPayload)
	fileID := enqueue(t, db, "--resource", "report", "--epoch", "1", "--op", "file-1", "--kind", "file",
		"--payload", `{"target":"`+target+`","content":"report by A"}`)

	mail := waitStatus(t, db, mailID, "succeeded")
	mailRes := resultOf(t, mail)
	wantMsgID := email.MessageID(mailKey, domain)
	if mailRes["message_id"] != wantMsgID {
		t.Fatalf("email result %v: message_id is not %s", mailRes, wantMsgID)
	}
	if n := countMessageID(t, mp, wantMsgID); n != 1 {
		t.Fatalf("Mailpit holds %d messages with Message-ID %s, want 1", n, wantMsgID)
	}

	fileRes := resultOf(t, waitStatus(t, db, fileID, "succeeded"))
	if fileRes["path"] != target || fileRes["epoch"] != 1.0 || fileRes["sha256"] != sha256Of("report by A") {
		t.Fatalf("file result = %v; want path %s, epoch 1, sha256 of the content", fileRes, target)
	}
	if b, err := os.ReadFile(filepath.Join(root, target)); err != nil || string(b) != "report by A" {
		t.Fatalf("published file = %q, %v; want %q", b, err, "report by A")
	}

	// B takes over (an external epoch advance) and re-runs the job: the same
	// business key from epoch 2 gets the stored result; nothing is re-sent.
	expectCode(t, gw(t, db, "epoch", "advance", "--resource", "report", "--epoch", "2"), 0, "")
	again := enqueue(t, db, "--resource", "report", "--epoch", "2", "--op", "mail-2", "--kind", "email",
		"--key", mailKey, "--payload", mailPayload)
	if again == mailID {
		t.Fatal("the second epoch's enqueue returned the first intent")
	}
	if res := resultOf(t, waitStatus(t, db, again, "succeeded")); !reflect.DeepEqual(res, mailRes) {
		t.Fatalf("same key from epoch 2: result %v, want the stored %v", res, mailRes)
	}
	if n := countMessageID(t, mp, wantMsgID); n != 1 {
		t.Fatalf("after the same key from epoch 2, Mailpit holds %d messages with Message-ID %s, want 1", n, wantMsgID)
	}

	// B publishes the file at epoch 2.
	newID := enqueue(t, db, "--resource", "report", "--epoch", "2", "--op", "file-2", "--kind", "file",
		"--payload", `{"target":"`+target+`","content":"report by B"}`)
	if res := resultOf(t, waitStatus(t, db, newID, "succeeded")); res["epoch"] != 2.0 || res["sha256"] != sha256Of("report by B") {
		t.Fatalf("epoch 2 file result = %v", res)
	}

	// A's late file intent: committed while epoch 1 was current, with fence
	// policy commit so the runtime does not re-check the epoch, and arriving
	// only now, after epoch 2 was published to the same target. No CLI path
	// can commit an epoch-1 intent any more (the enqueue is fenced), so it
	// is inserted as it would have been committed back then; NOTIFY is left
	// to the trigger or the poll.
	var staleID int64
	if err := pool.QueryRow(context.Background(), testdb.SQL(`
		INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
		VALUES ('report', 1, 'file-late', 'file', 'report/file-late', 'commit', $1)
		RETURNING intent_id`), `{"target":"`+target+`","content":"late report by A"}`).Scan(&staleID); err != nil {
		t.Fatal(err)
	}
	stale := resultOf(t, waitStatus(t, db, staleID, "superseded"))
	if stale["path"] != target || stale["rejected_epoch"] != 1.0 || stale["current_epoch"] != 2.0 {
		t.Fatalf("superseded result = %v; want path %s, rejected_epoch 1, current_epoch 2", stale, target)
	}
	if b, err := os.ReadFile(filepath.Join(root, target)); err != nil || string(b) != "report by B" {
		t.Fatalf("after the stale intent the file holds %q, %v; want %q", b, err, "report by B")
	}

	p.stop(t)
	t.Logf("end to end in %s", time.Since(start).Round(time.Millisecond))
}
