package idempotency_test

import (
	"testing"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// A Begin whose answer was lost (the primary failing over as it committed)
// left the key started, owned by its intent, no I/O declared: the caller's
// next Begin of the intent, naming the lost Begin's nonce, takes it back
// at once (Execute, a new token, the attempt not counted again) instead of
// waiting minutes for the lock to expire. It does so once only, and never
// with another nonce, or after I/O was declared. With and without group
// commit (whose shared Begin stores the nonce too).
func TestBeginTakesBackAnUnansweredBegin(t *testing.T) {
	t.Parallel()
	for _, group := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "group commit"}[group], func(t *testing.T) {
			t.Parallel()
			f := setup(t, idempotency.Config{Schema: testdb.Schema(), GroupCommit: group})
			id := f.intent("lost-begin")
			const lostNonce = 7001
			lost, err := f.store.BeginRecordingWith(f.ctx, kind, "lost-begin", f.fp, id, idempotency.BeginOptions{Nonce: lostNonce})
			if err != nil || lost.Outcome != idempotency.OutcomeExecute {
				t.Fatalf("first Begin = %+v, %v", lost, err)
			}
			// Its answer is lost: the caller never saw lost.

			// Without the nonce, or with another, the key is Busy.
			for _, o := range []idempotency.BeginOptions{{Nonce: 7002}, {Nonce: 7003, Unanswered: 6999}} {
				d, err := f.store.BeginRecordingWith(f.ctx, kind, "lost-begin", f.fp, id, o)
				if err != nil || d.Outcome != idempotency.OutcomeBusy {
					t.Fatalf("Begin %+v of a key with a fresh lock = %+v, %v; want Busy", o, d, err)
				}
			}
			back, err := f.store.BeginRecordingWith(f.ctx, kind, "lost-begin", f.fp, id, idempotency.BeginOptions{Nonce: 7004, Unanswered: lostNonce})
			if err != nil || back.Outcome != idempotency.OutcomeExecute || back.Token == lost.Token || back.Attempts != lost.Attempts {
				t.Fatalf("Begin naming the lost nonce = %+v, %v; want Execute with a new token and the attempts %d", back, err, lost.Attempts)
			}
			if err := f.store.CheckOwner(f.ctx, kind, "lost-begin", lost.Token); err == nil {
				t.Fatal("the lost Begin's token still owns the key")
			}
			// Once only: the key now carries the new nonce.
			again, err := f.store.BeginRecordingWith(f.ctx, kind, "lost-begin", f.fp, id, idempotency.BeginOptions{Nonce: 7005, Unanswered: lostNonce})
			if err != nil || again.Outcome != idempotency.OutcomeBusy {
				t.Fatalf("a second Begin naming the lost nonce = %+v, %v; want Busy", again, err)
			}
			f.complete("lost-begin", back, "succeeded", `{"ok":true}`)

			// Another intent's key with I/O declared is never taken back.
			id2 := f.intent("lost-io")
			d, err := f.store.BeginRecordingWith(f.ctx, kind, "lost-io", f.fp, id2, idempotency.BeginOptions{Nonce: 8001})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.store.EndIO(f.ctx, kind, "lost-io", d.Token); err != nil {
				t.Fatal(err)
			}
			d2, err := f.store.BeginRecordingWith(f.ctx, kind, "lost-io", f.fp, id2, idempotency.BeginOptions{Nonce: 8002, Unanswered: 8001})
			if err != nil || d2.Outcome == idempotency.OutcomeExecute {
				t.Fatalf("Begin naming the nonce of a key with I/O declared = %+v, %v; want no Execute", d2, err)
			}
			t.Logf("taken back once (token %d → %d), Busy %d times", lost.Token, back.Token, 3)
		})
	}
}
