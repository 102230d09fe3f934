package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters/file"
)

// world is a small clean run: worker a takes epoch 1 of r, enqueues one
// email (key r/mail/1, delivered once) and one file intent (published);
// b takes over with epoch 2, publishes after it and sends one webhook (key
// r/hook/1, acted on once).
func world() (*Observed, []Op) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ops := []Op{
		{Worker: "a", Kind: "acquire", Resource: "r", Holder: "a", Call: 10, Ret: 20, Result: "ok", OutEpoch: 1},
		{Worker: "a", Kind: "enqueue", Resource: "r", Holder: "a", Epoch: 1, Call: 30, Ret: 40, Result: "ok", OpID: "a-1",
			IntentKnd: "email", Key: "r/mail/1", IntentID: 1},
		{Worker: "a", Kind: "enqueue", Resource: "r", Holder: "a", Epoch: 1, Call: 50, Ret: 60, Result: "ok", OpID: "a-2",
			IntentKnd: "file", Key: "r/file/a-2", IntentID: 2},
		{Worker: "b", Kind: "acquire", Resource: "r", Holder: "b", Call: 70, Ret: 80, Result: "ok", OutEpoch: 2},
		{Worker: "b", Kind: "enqueue", Resource: "r", Holder: "b", Epoch: 2, Call: 90, Ret: 100, Result: "ok", OpID: "b-1",
			IntentKnd: "file", Key: "r/file/b-1", IntentID: 3},
		{Worker: "b", Kind: "enqueue", Resource: "r", Holder: "b", Epoch: 2, Call: 110, Ret: 120, Result: "ok", OpID: "b-2",
			IntentKnd: "webhook", Key: "r/hook/1", IntentID: 4},
	}
	pub := func(id, epoch int64, key string) file.Publication {
		return file.Publication{Target: "r.txt", Epoch: epoch, IntentID: id, IdempotencyKey: key, SHA256: key}
	}
	obs := &Observed{
		Intents: []Intent{
			{ID: 1, Resource: "r", Epoch: 1, OpID: "a-1", Kind: "email", Key: "r/mail/1", Payload: `{}`, Status: "succeeded", Committed: at(2)},
			{ID: 2, Resource: "r", Epoch: 1, OpID: "a-2", Kind: "file", Key: "r/file/a-2", Payload: `{"target":"r.txt"}`, Status: "succeeded", Committed: at(3)},
			{ID: 3, Resource: "r", Epoch: 2, OpID: "b-1", Kind: "file", Key: "r/file/b-1", Payload: `{"target":"r.txt"}`, Status: "succeeded", Committed: at(5)},
			{ID: 4, Resource: "r", Epoch: 2, OpID: "b-2", Kind: "webhook", Key: "r/hook/1", Payload: `{}`, Status: "succeeded", Committed: at(6)},
		},
		Grants:       []Grant{{Resource: "r", Epoch: 1, Holder: "a", Committed: at(1)}, {Resource: "r", Epoch: 2, Holder: "b", Committed: at(4)}},
		Epochs:       map[string]int64{"r": 2},
		MailCopies:   map[string]int{"r/mail/1": 1},
		MailByIntent: map[int64]int{1: 1},
		Hooks:        []Delivery{{Key: "r/hook/1", IntentID: 4, Epoch: 2}},
		Files: map[string]Target{"r.txt": {Exists: true, ContentMatches: true,
			Manifest: file.Manifest{Resource: "r", Publication: pub(3, 2, "r/file/b-1"), History: []file.Publication{pub(2, 1, "r/file/a-2")}}}},
		EmailOnce:  true,
		MailDomain: "chaos.test",
	}
	return obs, ops
}

// A run with no broken invariant passes, and its deliveries are tallied
// by outcome and effects.
func TestVerifyPasses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(*Observed)
		tally string // the webhook key's tally
	}{
		{"clean run", func(obs *Observed) {
			obs.Min = Minimum{Enqueues: 4, Effects: 1}
			obs.Faults, obs.Injected = map[string]int{HookLate: 1, "kill9_postgres": 1}, map[string]int{HookLate: 1, "kill9_postgres": 1}
		}, "succeeded: 1 effect"},
		// An effect is held against the intent whose attempt caused it: an
		// intent that failed (its attempts refused) beside another intent
		// of its key that succeeded is no contradiction.
		// A publication written ahead (the manifest's pending entry) whose
		// rename never happened — its owner check failed, or it crashed
		// before — is no effect: the intent is rightly superseded, and
		// the content is the last applied publication's. (The chaos run
		// flagged exactly this, seed 27: I7 and I2 on a file the intent
		// had never written.)
		{"pending publication never applied", func(obs *Observed) {
			last := obs.Intents[3].Committed
			obs.Grants = append(obs.Grants, Grant{Resource: "r", Epoch: 3, Holder: "c", Committed: last.Add(time.Millisecond)},
				Grant{Resource: "r", Epoch: 4, Holder: "d", Committed: last.Add(3 * time.Millisecond)})
			obs.Epochs["r"] = 4
			obs.Intents = append(obs.Intents, Intent{ID: 5, Resource: "r", Epoch: 3, OpID: "c-1", Kind: "file", Key: "r/file/c-1",
				Payload: `{"target":"r.txt"}`, Status: "superseded", Result: `{"fenced_at": "execute", "superseded_by_epoch": 4}`,
				Committed: last.Add(2 * time.Millisecond)})
			f := obs.Files["r.txt"]
			f.Manifest.History = append(f.Manifest.History, f.Manifest.Publication)
			f.Manifest.Publication = file.Publication{Target: "r.txt", Epoch: 3, IntentID: 5, IdempotencyKey: "r/file/c-1", SHA256: "r/file/c-1"}
			f.Manifest.State = file.StatePending
			obs.Files["r.txt"] = f
		}, "succeeded: 1 effect"},
		{"effects attributed", func(obs *Observed) {
			obs.Intents = append(obs.Intents, Intent{ID: 5, Resource: "r", Epoch: 2, OpID: "b-3", Kind: "webhook", Key: "r/hook/1", Payload: `{}`,
				Status: "failed", LastError: "gave up after 5 attempts: 503", Committed: obs.Intents[3].Committed.Add(time.Millisecond)})
			obs.Hooks = append(obs.Hooks, Delivery{Key: "r/hook/1", IntentID: 5, Epoch: 2, Fault: Hook503, Refused: true})
		}, "failed+succeeded: 1 effect"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			obs, ops := world()
			tc.setup(obs)
			r := Verify(obs, ops)
			if len(r.Violations) != 0 {
				t.Fatalf("flagged: %v", r.Violations)
			}
			if got := r.Deliveries["webhook"][tc.tally]; got != 1 {
				t.Fatalf("webhook tally %v, want one key with %q", r.Deliveries["webhook"], tc.tally)
			}
		})
	}
}

// Each broken invariant is flagged, by name, with a message naming what
// is wrong.
func TestVerifyFlags(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		invariant string
		want      string // in the violation's message
		breakIt   func(*Observed, *[]Op)
	}{
		// (a) more than one copy of a business key where the mode promises one.
		{"two messages of one key", "I3", `email: 2 effects of business key "r/mail/1" at a destination that does not dedup`, func(o *Observed, _ *[]Op) {
			o.MailCopies["r/mail/1"] = 2
		}},
		{"a webhook acted on twice", "I3", `webhook: 2 effects of business key "r/hook/1"`, func(o *Observed, _ *[]Op) {
			o.Hooks = append(o.Hooks, o.Hooks[0])
		}},
		{"one key published twice", "I3", "business key r/file/a-2 published 2 times", func(o *Observed, _ *[]Op) {
			f := o.Files["r.txt"]
			f.Manifest.History = append(f.Manifest.History, f.Manifest.History[0])
			o.Files["r.txt"] = f
		}},
		// (b) a recorded status that contradicts the effect.
		{"failed email delivered", "I7", "email: intent 1 (key \"r/mail/1\") is failed, but the destination acted on 1 of its attempts", func(o *Observed, _ *[]Op) {
			o.Intents[0].Status = "failed"
		}},
		{"failed webhook acted on", "I7", "webhook: intent 4 (key \"r/hook/1\") is failed, but the destination acted on 1", func(o *Observed, _ *[]Op) {
			o.Intents[3].Status = "failed"
		}},
		{"unknown without a reason", "U", "webhook: intent 4 (key \"r/hook/1\") is unknown without a last_error", func(o *Observed, _ *[]Op) {
			o.Intents[3].Status = "unknown"
		}},
		{"unexpected SQL error", "E", `1 enqueue operations failed unexpectedly (first: worker b on r): ERROR: relation "chaos_intent_log" does not exist`, func(_ *Observed, ops *[]Op) {
			*ops = append(*ops, Op{Worker: "b", Kind: "enqueue", Resource: "r", Holder: "b", Epoch: 2, Call: 130, Ret: 140, Result: "error", OpID: "b-3",
				IntentKnd: "file", Key: "r/file/b-3", Err: `ERROR: relation "chaos_intent_log" does not exist (SQLSTATE 42P01)`})
		}},
		{"too few enqueues", "V", "only 4 acknowledged enqueues, want at least 5", func(o *Observed, _ *[]Op) {
			o.Min.Enqueues = 5
		}},
		{"no effects", "V", "only 1 webhook effects, want at least 2", func(o *Observed, _ *[]Op) {
			o.Min.Effects = 2
		}},
		{"a fault never injected", "V", "fault hook_drop_reused was scheduled 2 times and never injected", func(o *Observed, _ *[]Op) {
			o.Faults = map[string]int{HookDropReused: 2, HookLate: 1}
			o.Injected = map[string]int{HookLate: 1}
		}},
		{"superseded file published", "I7", "intent 2 (a-2, key r/file/a-2) is superseded, but r.txt holds its publication", func(o *Observed, _ *[]Op) {
			o.Intents[1].Status = "superseded"
		}},
		{"succeeded file only written ahead", "I7", "intent 3 (b-1, key r/file/b-1) succeeded, but r.txt has no publication of its key", func(o *Observed, _ *[]Op) {
			f := o.Files["r.txt"]
			f.Manifest.State = file.StatePending // its rename never happened
			o.Files["r.txt"] = f
		}},
		{"cancelled file published", "I7", "is cancelled, but r.txt holds its publication", func(o *Observed, _ *[]Op) {
			o.Intents[2].Status = "cancelled"
		}},
		{"succeeded email not delivered", "I7", "email: business key \"r/mail/1\" succeeded, but the destination holds no effect", func(o *Observed, _ *[]Op) {
			o.MailCopies["r/mail/1"] = 0
		}},
		{"succeeded webhook not acted on", "I7", "webhook: business key \"r/hook/1\" succeeded, but the destination holds no effect", func(o *Observed, _ *[]Op) {
			o.Hooks = nil
		}},
		{"succeeded file not published", "I7", "intent 2 (a-2, key r/file/a-2) succeeded, but r.txt has no publication", func(o *Observed, _ *[]Op) {
			f := o.Files["r.txt"]
			f.Manifest.History = nil
			o.Files["r.txt"] = f
		}},
		// (c) an acknowledged grant or enqueue lost in a PostgreSQL crash.
		{"lost enqueue", "I8", "acknowledged enqueue r/a-2 (intent 2) is not in the outbox; PostgreSQL was killed (-9) 150ms after", func(o *Observed, ops *[]Op) {
			o.Intents = o.Intents[:1]
			o.Files = map[string]Target{}
			o.Crashes = []int64{60 + int64(150*time.Millisecond)}
		}},
		{"lost enqueue, answered while PostgreSQL was dying", "I8", "is not in the outbox; PostgreSQL was being killed (-9) 20ms before the acknowledgement", func(o *Observed, ops *[]Op) {
			o.Intents = o.Intents[:1]
			o.Files = map[string]Target{}
			(*ops)[2].Ret += int64(20 * time.Millisecond)
			o.Crashes = []int64{60}
		}},
		{"lost grant, not granted again", "I8", `acknowledged grant of epoch 2 on r to "b" is lost: the database has no grant of that epoch`, func(o *Observed, ops *[]Op) {
			// b's grant and everything after it were lost.
			o.Grants = o.Grants[:1]
			o.Intents = o.Intents[:2]
			o.Epochs["r"] = 1
			f := o.Files["r.txt"]
			f.Manifest.Publication, f.Manifest.History = f.Manifest.History[0], nil
			o.Files["r.txt"] = f
			*ops = (*ops)[:4]
		}},
		{"lost grant, granted again", "I8", `acknowledged grant of epoch 2 on r to "b" is lost: the database granted that epoch to "c"`, func(o *Observed, ops *[]Op) {
			o.Grants[1].Holder = "c"
		}},
		// (d) one epoch granted twice.
		{"epoch acknowledged twice", "I9", "r epoch 2 was granted 2 times: to b (worker b), c (worker c)", func(o *Observed, ops *[]Op) {
			*ops = append(*ops, Op{Worker: "c", Kind: "acquire", Resource: "r", Holder: "c", Call: 110, Ret: 120, Result: "ok", OutEpoch: 2})
		}},
		{"shared holder, one epoch", "I9", "r epoch 1 was granted 2 times: to a (worker a), a (worker x)", func(o *Observed, ops *[]Op) {
			*ops = append(*ops, Op{Worker: "x", Kind: "acquire", Resource: "r", Holder: "a", Call: 21, Ret: 25, Result: "ok", OutEpoch: 1})
		}},
		{"epoch logged twice", "I9", "the database changed r to epoch 2 2 times", func(o *Observed, ops *[]Op) {
			o.Grants = append(o.Grants, Grant{Resource: "r", Epoch: 2, Holder: "c", Committed: o.Grants[1].Committed.Add(time.Millisecond)})
		}},
	}
	for _, c := range cases {
		obs, ops := world()
		c.breakIt(obs, &ops)
		r := Verify(obs, ops)
		found := false
		for _, v := range r.Violations {
			found = found || (v.Invariant == c.invariant && strings.Contains(v.Message, c.want))
		}
		if !found {
			t.Errorf("%s: no %s violation containing %q; got %v", c.name, c.invariant, c.want, r.Violations)
		}
	}
}

// A publication that may have dropped out of a full manifest history is
// not counted as missing.
func TestVerifyTruncatedHistory(t *testing.T) {
	t.Parallel()
	obs, ops := world()
	f := obs.Files["r.txt"]
	f.Manifest.History, f.Truncated = nil, true
	obs.Files["r.txt"] = f
	if r := Verify(obs, ops); r.Count("I7") != 0 {
		t.Fatalf("a publication older than a full history was flagged: %v", r.Violations)
	}
}

// A history porcupine rejects is explained by its first plain
// contradiction: the grant and the operation that ignored it.
func TestVerifyExplainsLinearizability(t *testing.T) {
	t.Parallel()
	obs, ops := world()
	// a's enqueue with epoch 1 accepted after b's epoch 2 was acknowledged.
	ops = append(ops, Op{Worker: "a", Kind: "enqueue", Resource: "r", Holder: "a", Epoch: 1, Call: 110, Ret: 120, Result: "ok", OpID: "a-3",
		IntentKnd: "file", Key: "r/file/a-3", IntentID: 4})
	obs.Intents = append(obs.Intents, Intent{ID: 4, Resource: "r", Epoch: 1, OpID: "a-3", Kind: "file", Key: "r/file/a-3",
		Payload: `{"target":"r.txt"}`, Status: "superseded", Committed: obs.Intents[2].Committed.Add(time.Millisecond)})
	r := Verify(obs, ops)
	for _, v := range r.Violations {
		if v.Invariant == "L" {
			if !strings.Contains(v.Message, "an enqueue with epoch 1 was accepted after epoch 2 had been granted") ||
				strings.Count(v.Evidence, "\n") != 1 {
				t.Fatalf("unexplained: %s\n%s", v.Message, v.Evidence)
			}
			return
		}
	}
	t.Fatalf("no L violation: %v", r.Violations)
}
