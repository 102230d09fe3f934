package idempotency_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// The settle window's facts live on the key: EndIO records when the owner's
// I/O ended, AwaitProof judges the window by PostgreSQL's clock and renews
// the lock, a takeover keeps a recorded end of I/O and otherwise records its
// own time, and BeginIO clears it before new I/O.
func TestSettleWindowOnTheKey(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema(), LockTimeout: time.Minute})
	id := f.intent("k")
	d := f.begin("k", id)
	if k := f.key("k"); k.LastIOAt != nil {
		t.Fatalf("new key: last_io_at %v; want unset (I/O may be in progress)", k.LastIOAt)
	}
	ended, err := f.store.EndIO(f.ctx, kind, "k", d.Token)
	if err != nil {
		t.Fatal(err)
	}
	p, err := f.store.AwaitProof(f.ctx, kind, "k", d.Token, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if p.Settled || !p.LastIOAt.Equal(ended) || !p.TrustedAfter.Equal(ended.Add(time.Hour)) || p.Remaining <= 59*time.Minute {
		t.Fatalf("proof %+v; want not settled, trusted an hour after %s", p, ended)
	}
	if p, err = f.store.AwaitProof(f.ctx, kind, "k", d.Token, time.Microsecond); err != nil || !p.Settled || p.Remaining != 0 {
		t.Fatalf("proof with a tiny window = %+v, %v; want settled", p, err)
	}
	// A takeover (the lock expired) keeps the recorded end of I/O.
	f.expire("k")
	d2 := f.begin("k", id)
	if d2.Outcome != idempotency.OutcomeRecover || d2.LastIOAt == nil || !d2.LastIOAt.Equal(ended) {
		t.Fatalf("takeover = %+v; want Recover with last_io_at %s", d2, ended)
	}
	// The old owner can neither end, await nor begin I/O any more.
	if _, err := f.store.AwaitProof(f.ctx, kind, "k", d.Token, time.Hour); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("old owner's AwaitProof: %v; want lost ownership", err)
	}
	if _, err := f.store.BeginIO(f.ctx, kind, "k", d.Token, id, false); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("old owner's BeginIO: %v; want lost ownership", err)
	}
	// The new owner executes: last_io_at cleared, and a takeover of that
	// attempt records its own time.
	if n, err := f.store.BeginIO(f.ctx, kind, "k", d2.Token, id, true); err != nil || n != 3 {
		t.Fatalf("BeginIO counting an attempt = %d, %v; want 3", n, err)
	}
	if k := f.key("k"); k.LastIOAt != nil {
		t.Fatalf("after BeginIO: last_io_at %v; want unset", k.LastIOAt)
	}
	f.expire("k")
	before := f.dbNow()
	d3 := f.begin("k", id)
	if d3.Outcome != idempotency.OutcomeRecover || d3.LastIOAt == nil || d3.LastIOAt.Before(before) {
		t.Fatalf("takeover of an executing attempt = %+v; want last_io_at at the takeover (after %s)", d3, before)
	}
}

// The intent that owns a key and waits for proof (its I/O over, its lock
// fresh) gets the key back on its redelivery — a new token, no attempt
// counted — while another intent with the same key is Busy.
func TestWaitingOwnerResumes(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema(), LockTimeout: time.Minute})
	id := f.intent("k")
	d := f.begin("k", id)
	// Not waiting yet (I/O may be in progress): Busy, even for itself.
	if again := f.begin("k", id); again.Outcome != idempotency.OutcomeBusy {
		t.Fatalf("begin while executing = %s; want busy", again.Outcome)
	}
	if _, err := f.store.EndIO(f.ctx, kind, "k", d.Token); err != nil {
		t.Fatal(err)
	}
	other := f.intent("k")
	if b := f.begin("k", other); b.Outcome != idempotency.OutcomeBusy {
		t.Fatalf("another intent's begin = %s; want busy", b.Outcome)
	}
	r := f.begin("k", id)
	if r.Outcome != idempotency.OutcomeRecover || !r.Resumed || r.Token == d.Token || r.Attempts != 1 {
		t.Fatalf("redelivery = %+v; want resumed with a new token and 1 attempt", r)
	}
	if err := f.store.CheckOwner(f.ctx, kind, "k", d.Token); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("CheckOwner of the old token: %v; want lost ownership", err)
	}
	if err := f.store.CheckOwner(f.ctx, kind, "k", r.Token); err != nil {
		t.Fatalf("CheckOwner of the owner: %v", err)
	}
	// An expired lock is no ownership to act on: it can be taken over at
	// any moment.
	f.expire("k")
	if err := f.store.CheckOwner(f.ctx, kind, "k", r.Token); !errors.Is(err, idempotency.ErrLostOwnership) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("CheckOwner with an expired lock: %v; want lost ownership (expired)", err)
	}
}

// SupersedeUnstarted supersedes only an intent no attempt has begun for.
func TestSupersedeUnstarted(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	started, unstarted := f.intent("a"), f.intent("b")
	f.begin("a", started)
	if _, ok, err := f.store.SupersedeUnstarted(f.ctx, unstarted); err != nil || ok {
		t.Fatalf("while the resource is at the intent's epoch: %v, %v; want not superseded", ok, err)
	}
	f.exec(`UPDATE fencegate.resources SET epoch = epoch + 1 WHERE resource_id = $1`, resource)
	if _, ok, err := f.store.SupersedeUnstarted(f.ctx, started); err != nil || ok {
		t.Fatalf("with an attempt begun: %v, %v; want not superseded", ok, err)
	}
	cur, ok, err := f.store.SupersedeUnstarted(f.ctx, unstarted)
	if err != nil || !ok || cur != f.epoch+1 {
		t.Fatalf("unstarted = %d, %v, %v; want superseded by epoch %d", cur, ok, err, f.epoch+1)
	}
	if r := f.record(unstarted); r.Status != outbox.StatusSuperseded || !strings.Contains(string(r.Result), "superseded_by_epoch") {
		t.Fatalf("record %s %s", r.Status, r.Result)
	}
	if r := f.record(started); r.Status.Terminal() {
		t.Fatalf("started intent = %s; want untouched", r.Status)
	}
}

// BeginRecording records Done, Conflict and held outcomes in Begin's own
// transaction; an intent that is already final keeps its status and gets
// the outcome in its history.
func TestBeginRecording(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	first := f.intent("k")
	f.complete("k", f.begin("k", first), outbox.StatusSucceeded, `{"n":1}`)
	second := f.intent("k")
	d, err := f.store.BeginRecording(f.ctx, kind, "k", f.fp, second)
	if err != nil || d.Outcome != idempotency.OutcomeDone || !d.IntentRecorded {
		t.Fatalf("BeginRecording = %+v, %v; want Done, recorded", d, err)
	}
	if r := f.record(second); r.Status != outbox.StatusSucceeded || string(r.Result) != `{"n": 1}` {
		t.Fatalf("second intent %s %s; want the stored result", r.Status, r.Result)
	}
	third := f.intent("k")
	f.exec(`UPDATE fencegate.intents SET status = 'cancelled' WHERE intent_id = $1`, third)
	conflict, err := f.store.BeginRecording(f.ctx, kind, "k", "other-fingerprint", third)
	if err != nil || conflict.Outcome != idempotency.OutcomeConflict || conflict.IntentRecorded {
		t.Fatalf("BeginRecording on a cancelled intent = %+v, %v; want Conflict, not recorded", conflict, err)
	}
	if r := f.record(third); r.Status != outbox.StatusCancelled {
		t.Fatalf("cancelled intent is now %s", r.Status)
	}
	var action, note string
	if err := f.pool.QueryRow(f.ctx, testdb.SQL(`SELECT action, note FROM fencegate.intent_events WHERE intent_id = $1`), third).Scan(&action, &note); err != nil {
		t.Fatal(err)
	}
	if action != idempotency.EventOutcomeNotRecorded || !strings.Contains(note, "failed") || !strings.Contains(note, "cancelled") {
		t.Fatalf("event %s %q", action, note)
	}
}

func (f *fixture) dbNow() time.Time {
	f.t.Helper()
	var now time.Time
	if err := f.pool.QueryRow(f.ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		f.t.Fatal(err)
	}
	return now
}
