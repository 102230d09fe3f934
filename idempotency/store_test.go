package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

const (
	kind     = "email"
	resource = "report/2026-12-01"
)

var emailPayload = json.RawMessage(`{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t"}`)

// fixture is what a test needs: a store on its own database and a way to
// create intents.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	pool  *pgxpool.Pool
	store *idempotency.Store
	ob    *outbox.Client
	epoch int64
	ops   *atomic.Int64
	fp    string
}

// with returns the fixture for a subtest, so that failures are reported
// (and FailNow called) on the subtest's own goroutine.
func (f *fixture) with(t *testing.T) *fixture {
	g := *f
	g.t = t
	return &g
}

func setup(t *testing.T, cfg idempotency.Config) *fixture {
	t.Helper()
	return setupOn(t, testdb.New(t), cfg)
}

// setupOn is setup on a pool of the test's own (a database of testdb's).
func setupOn(t *testing.T, pool *pgxpool.Pool, cfg idempotency.Config) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	store, err := idempotency.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema(), DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	l, err := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())).Acquire(ctx, resource, "worker-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, ctx: ctx, pool: pool, store: store, ob: ob, epoch: l.Epoch, ops: new(atomic.Int64),
		fp: idempotency.Fingerprint(kind, emailPayload)}
}

// intent enqueues an email intent under the business key and returns its id.
func (f *fixture) intent(key string) int64 {
	f.t.Helper()
	r, err := f.ob.Enqueue(f.ctx, outbox.Intent{
		Resource:       resource,
		Epoch:          f.epoch,
		OperationID:    fmt.Sprintf("op-%d", f.ops.Add(1)),
		Kind:           kind,
		IdempotencyKey: key,
		Payload:        emailPayload,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return r.IntentID
}

// started enqueues an intent under key and begins its attempt: the intent
// and its decision.
func (f *fixture) started(key string) (int64, idempotency.Decision) {
	f.t.Helper()
	id := f.intent(key)
	return id, f.begin(key, id)
}

func (f *fixture) begin(key string, intentID int64) idempotency.Decision {
	f.t.Helper()
	return f.beginFP(key, f.fp, intentID)
}

func (f *fixture) beginFP(key, fp string, intentID int64) idempotency.Decision {
	f.t.Helper()
	d, err := f.store.Begin(f.ctx, kind, key, fp, intentID)
	if err != nil {
		f.t.Fatalf("begin %q for intent %d: %v", key, intentID, err)
	}
	return d
}

func (f *fixture) complete(key string, d idempotency.Decision, status outbox.Status, result string) {
	f.t.Helper()
	c := idempotency.Completion{Kind: kind, Key: key, Token: d.Token, IntentID: d.OwnerIntentID, Status: status}
	if result != "" {
		c.Result = json.RawMessage(result)
	}
	if _, err := f.store.Complete(f.ctx, c); err != nil {
		f.t.Fatalf("complete %q: %v", key, err)
	}
}

// expire makes the key's lock expired, as if its attempt were abandoned
// long ago, without waiting.
func (f *fixture) expire(key string) {
	f.t.Helper()
	f.exec(`UPDATE fencegate.idempotency_keys SET locked_until = now() - interval '1 second' WHERE kind = $1 AND idempotency_key = $2`, kind, key)
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, testdb.SQL(sql), args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

func (f *fixture) key(key string) *idempotency.Key {
	f.t.Helper()
	k, err := f.store.Get(f.ctx, kind, key)
	if err != nil {
		f.t.Fatalf("get %q: %v", key, err)
	}
	return k
}

func (f *fixture) record(intentID int64) *outbox.Record {
	f.t.Helper()
	r, err := f.ob.Get(f.ctx, intentID)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := `{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t","n":[1,{"b":2,"a":1}]}`
	cases := []struct {
		name  string
		kind  string
		other string
		same  bool
	}{
		{"identical", "email", base, true},
		{"key order", "email", `{"n":[1,{"a":1,"b":2}],"text":"t","subject":"s","from":"b@example.com","to":"a@example.com"}`, true},
		{"whitespace", "email", "{ \"to\" : \"a@example.com\",\n\t\"from\":\"b@example.com\", \"subject\":\"s\",\"text\":\"t\",\"n\":[ 1 , {\"b\":2,\"a\":1} ] }\n", true},
		{"escapes", "email", `{"to":"a@example.com","from":"b@example.com","subject":"\u0073","text":"t","n":[1,{"b":2,"a":1}]}`, true},
		{"other kind", "file", base, false},
		{"other value", "email", `{"to":"a@example.com","from":"b@example.com","subject":"S","text":"t","n":[1,{"b":2,"a":1}]}`, false},
		{"array order matters", "email", `{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t","n":[{"b":2,"a":1},1]}`, false},
		{"number literal", "email", `{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t","n":[1.0,{"b":2,"a":1}]}`, false},
		{"missing field", "email", `{"to":"a@example.com","from":"b@example.com","subject":"s","n":[1,{"b":2,"a":1}]}`, false},
		{"not json", "email", `not json`, false},
	}
	want := idempotency.Fingerprint("email", []byte(base))
	if len(want) != 64 {
		t.Fatalf("fingerprint %q is not 64 hex digits", want)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := idempotency.Fingerprint(c.kind, []byte(c.other))
			if (got == want) != c.same {
				t.Fatalf("Fingerprint(%q, %s) == base is %v, want %v", c.kind, c.other, got == want, c.same)
			}
		})
	}
	t.Run("raw bytes", func(t *testing.T) {
		a := idempotency.Fingerprint("email", []byte("not json"))
		if a != idempotency.Fingerprint("email", []byte("not json")) || a == idempotency.Fingerprint("email", []byte("not json ")) {
			t.Fatal("raw payloads must be hashed byte for byte")
		}
		if idempotency.Fingerprint("ab", []byte(`"c"`)) == idempotency.Fingerprint("a", []byte(`b"c"`)) {
			t.Fatal("kind and payload must not run together")
		}
	})
	t.Run("survives jsonb", func(t *testing.T) {
		t.Parallel()
		f := setup(t, idempotency.Config{Schema: testdb.Schema()})
		id := f.intent("k-jsonb")
		var stored string
		if err := f.pool.QueryRow(f.ctx, testdb.SQL(`SELECT payload::text FROM fencegate.intents WHERE intent_id = $1`), id).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored == string(emailPayload) {
			t.Logf("jsonb kept the text as is: %s", stored)
		}
		if idempotency.Fingerprint(kind, []byte(stored)) != f.fp {
			t.Fatalf("fingerprint of the payload read back from jsonb (%s) differs from the enqueued one", stored)
		}
	})
}

// Each of Begin's five outcomes, and the held variant of Busy.
func TestBeginOutcomes(t *testing.T) {
	t.Parallel()
	f0 := setup(t, idempotency.Config{Schema: testdb.Schema()})
	otherFP := idempotency.Fingerprint(kind, []byte(`{"other":true}`))

	type prepared struct {
		owner int64 // the intent whose attempt owns or completed the key
		token int64 // its token
	}
	cases := []struct {
		name string
		// state brings the key, begun by an intent of its own (the owner),
		// into the state under test; nil: a new key.
		state func(f *fixture, key string, d idempotency.Decision)
		fp    string
		check func(f *fixture, key string, p prepared, intentID int64, d idempotency.Decision)
	}{
		{
			name: "execute on a new key",
			fp:   f0.fp,
			check: func(f *fixture, key string, _ prepared, id int64, d idempotency.Decision) {
				if d.Outcome != idempotency.OutcomeExecute || d.Token < 1 || d.OwnerIntentID != id || d.Attempts != 1 || d.LockedUntil.IsZero() {
					f.t.Fatalf("decision %+v, want execute with a token, owner %d, attempt 1", d, id)
				}
				k := f.key(key)
				if k.State != idempotency.StateStarted || k.Token != d.Token || k.Fingerprint != f.fp || k.OwnerIntentID != id || k.FirstIntentID != id {
					f.t.Fatalf("key %+v after execute", k)
				}
				if r := f.record(id); r.Attempts != 1 {
					f.t.Fatalf("intent attempts %d, want 1", r.Attempts)
				}
			},
		},
		{
			name: "done after completion with the same fingerprint",
			state: func(f *fixture, key string, d idempotency.Decision) {
				f.complete(key, d, outbox.StatusSucceeded, `{"message_id":"<m1@fencegate>"}`)
			},
			fp: f0.fp,
			check: func(f *fixture, _ string, p prepared, id int64, d idempotency.Decision) {
				if d.Outcome != idempotency.OutcomeDone || d.Status != outbox.StatusSucceeded || d.OwnerIntentID != p.owner || d.Token != 0 || d.Attempts != 0 {
					f.t.Fatalf("decision %+v, want done by intent %d", d, p.owner)
				}
				var res map[string]string
				if err := json.Unmarshal(d.Result, &res); err != nil || res["message_id"] != "<m1@fencegate>" {
					f.t.Fatalf("result %s, want the recorded one", d.Result)
				}
				if r := f.record(id); r.Attempts != 0 {
					f.t.Fatalf("done counted an attempt: %d", r.Attempts)
				}
			},
		},
		{
			name:  "done carries a permanent failure",
			state: func(f *fixture, key string, d idempotency.Decision) { f.complete(key, d, outbox.StatusFailed, "") },
			fp:    f0.fp,
			check: func(f *fixture, _ string, p prepared, _ int64, d idempotency.Decision) {
				if d.Outcome != idempotency.OutcomeDone || d.Status != outbox.StatusFailed || d.OwnerIntentID != p.owner || d.Result != nil {
					f.t.Fatalf("decision %+v, want done/failed by intent %d", d, p.owner)
				}
			},
		},
		{
			name:  "busy while another attempt holds a fresh lock",
			state: func(*fixture, string, idempotency.Decision) {},
			fp:    f0.fp,
			check: func(f *fixture, key string, p prepared, id int64, d idempotency.Decision) {
				if d.Outcome != idempotency.OutcomeBusy || d.OwnerIntentID != p.owner || d.Token != 0 || d.Held {
					f.t.Fatalf("decision %+v, want busy, owned by intent %d", d, p.owner)
				}
				if d.RetryAfter <= 0 || d.RetryAfter > idempotency.DefaultLockTimeout || d.LockedUntil.IsZero() {
					f.t.Fatalf("busy retry after %s, locked until %s: want the other lock's expiry", d.RetryAfter, d.LockedUntil)
				}
				if k := f.key(key); k.Token != p.token || k.OwnerIntentID != p.owner {
					f.t.Fatalf("busy changed the key: %+v", k)
				}
				if r := f.record(id); r.Attempts != 0 {
					f.t.Fatalf("busy counted an attempt: %d", r.Attempts)
				}
			},
		},
		{
			name:  "recover an abandoned attempt",
			state: func(f *fixture, key string, _ idempotency.Decision) { f.expire(key) },
			fp:    f0.fp,
			check: func(f *fixture, key string, p prepared, id int64, d idempotency.Decision) {
				if d.Outcome != idempotency.OutcomeRecover || d.Token <= p.token || d.OwnerIntentID != id || d.Attempts != 1 {
					f.t.Fatalf("decision %+v, want recover with a new token above %d, owner %d", d, p.token, id)
				}
				k := f.key(key)
				if k.State != idempotency.StateStarted || k.Token != d.Token || k.OwnerIntentID != id || k.FirstIntentID != p.owner || k.Attempts != 2 {
					f.t.Fatalf("key %+v after recover", k)
				}
			},
		},
		{
			name: "busy, held, after an unknown outcome",
			state: func(f *fixture, key string, d idempotency.Decision) {
				f.complete(key, d, outbox.StatusUnknown, `{"smtp":"connection reset after DATA"}`)
			},
			fp: f0.fp,
			check: func(f *fixture, key string, p prepared, id int64, d idempotency.Decision) {
				if d.Outcome != idempotency.OutcomeBusy || !d.Held || d.Status != outbox.StatusUnknown || d.OwnerIntentID != p.owner || d.RetryAfter != 0 || !d.LockedUntil.IsZero() {
					f.t.Fatalf("decision %+v, want busy/held by intent %d", d, p.owner)
				}
				if k := f.key(key); k.State != idempotency.StateHeld || k.Token != p.token {
					f.t.Fatalf("key %+v, want held", k)
				}
			},
		},
		{
			name:  "conflict with a different fingerprint",
			state: func(f *fixture, key string, d idempotency.Decision) { f.complete(key, d, outbox.StatusSucceeded, "") },
			fp:    otherFP,
			check: func(f *fixture, key string, p prepared, _ int64, d idempotency.Decision) {
				if d.Outcome != idempotency.OutcomeConflict || d.OwnerIntentID != p.owner || d.Token != 0 {
					f.t.Fatalf("decision %+v, want conflict naming intent %d", d, p.owner)
				}
				if k := f.key(key); k.Fingerprint != f.fp || k.State != idempotency.StateCompleted {
					f.t.Fatalf("conflict changed the key: %+v", k)
				}
			},
		},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := f0.with(t)
			key := fmt.Sprintf("outcome-%d", i)
			var p prepared
			if c.state != nil {
				owner, d := f.started(key)
				p = prepared{owner: owner, token: d.Token}
				c.state(f, key, d)
			}
			id := f.intent(key)
			d := f.beginFP(key, c.fp, id)
			c.check(f, key, p, id, d)
		})
	}
}

// A different fingerprint is a conflict whatever the key's state, and never
// takes the key over.
func TestConflictNeverExecutes(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	otherFP := idempotency.Fingerprint(kind, []byte(`{"to":"x@example.com","from":"b@example.com","subject":"s","text":"t"}`))
	states := map[string]func(f *fixture, key string, d idempotency.Decision){
		"started":          func(*fixture, string, idempotency.Decision) {},
		"started, expired": func(f *fixture, key string, _ idempotency.Decision) { f.expire(key) },
		"succeeded":        func(f *fixture, key string, d idempotency.Decision) { f.complete(key, d, outbox.StatusSucceeded, "") },
		"failed":           func(f *fixture, key string, d idempotency.Decision) { f.complete(key, d, outbox.StatusFailed, "") },
		"held":             func(f *fixture, key string, d idempotency.Decision) { f.complete(key, d, outbox.StatusUnknown, "") },
	}
	for name, prepare := range states {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := f.with(t)
			key := "conflict/" + name
			owner, d := f.started(key)
			prepare(f, key, d)
			before := f.key(key)
			for range 3 {
				id := f.intent(key)
				got := f.beginFP(key, otherFP, id)
				if got.Outcome != idempotency.OutcomeConflict || got.OwnerIntentID != owner || got.Token != 0 {
					t.Fatalf("decision %+v, want conflict naming intent %d", got, owner)
				}
				if r := f.record(id); r.Attempts != 0 {
					t.Fatalf("conflict counted an attempt")
				}
			}
			after := f.key(key)
			if after.Token != before.Token || after.State != before.State || after.Fingerprint != f.fp || after.Attempts != before.Attempts {
				t.Fatalf("conflicts changed the key: before %+v, after %+v", before, after)
			}
		})
	}
}

// N attempts Begin the same new key at once: exactly one executes, the
// others are busy; after it completes, every later Begin is done.
func TestBeginConcurrentSameKey(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	const n, rounds = 16, 5
	for round := range rounds {
		key := fmt.Sprintf("concurrent-%d", round)
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = f.intent(key)
		}
		decisions := beginAll(t, f, key, ids)
		winner := -1
		for i, d := range decisions {
			switch d.Outcome {
			case idempotency.OutcomeExecute:
				if winner >= 0 {
					t.Fatalf("round %d: intents %d and %d both got execute", round, ids[winner], ids[i])
				}
				winner = i
			case idempotency.OutcomeBusy:
			default:
				t.Fatalf("round %d: intent %d got %s, want execute or busy", round, ids[i], d.Outcome)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody got execute", round)
		}
		for i, d := range decisions {
			if i != winner && d.OwnerIntentID != ids[winner] {
				t.Fatalf("round %d: busy names owner %d, want %d", round, d.OwnerIntentID, ids[winner])
			}
		}
		f.complete(key, decisions[winner], outbox.StatusSucceeded, `{"ok":true}`)
		for i, d := range beginAll(t, f, key, ids) {
			if d.Outcome != idempotency.OutcomeDone || d.OwnerIntentID != ids[winner] || string(d.Result) != `{"ok": true}` {
				t.Fatalf("round %d: after completion intent %d got %+v (result %s), want done by %d", round, ids[i], d, d.Result, ids[winner])
			}
		}
	}
}

// N attempts Begin the same abandoned key at once: exactly one recovers.
func TestBeginConcurrentRecover(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	const n, rounds = 16, 5
	for round := range rounds {
		key := fmt.Sprintf("recover-%d", round)
		_, abandoned := f.started(key)
		f.expire(key)
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = f.intent(key)
		}
		var recovered []idempotency.Decision
		for _, d := range beginAll(t, f, key, ids) {
			switch d.Outcome {
			case idempotency.OutcomeRecover:
				recovered = append(recovered, d)
			case idempotency.OutcomeBusy:
			default:
				t.Fatalf("round %d: got %s, want recover or busy", round, d.Outcome)
			}
		}
		if len(recovered) != 1 {
			t.Fatalf("round %d: %d attempts recovered the abandoned key at once, want exactly 1: %+v", round, len(recovered), recovered)
		}
		if k := f.key(key); k.Token != recovered[0].Token || k.Token == abandoned.Token || k.Attempts != 2 {
			t.Fatalf("round %d: key %+v, want owned by the one recoverer (token %d)", round, k, recovered[0].Token)
		}
	}
}

// beginAll runs one Begin per intent, all released at once.
func beginAll(t *testing.T, f *fixture, key string, ids []int64) []idempotency.Decision {
	t.Helper()
	out := make([]idempotency.Decision, len(ids))
	errs := make([]error, len(ids))
	var ready, wg sync.WaitGroup
	start := make(chan struct{})
	for i, id := range ids {
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Take a connection before the start line, so the Begins race
			// in PostgreSQL rather than in the pool's dialer.
			conn, err := f.pool.Acquire(f.ctx)
			if err == nil {
				conn.Release()
			}
			ready.Done()
			<-start
			out[i], errs[i] = f.store.Begin(f.ctx, kind, key, f.fp, id)
		}()
	}
	ready.Wait()
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("begin for intent %d: %v", ids[i], err)
		}
	}
	return out
}

// An attempt whose lock expires is taken over: Recover with a new token,
// and the abandoned attempt can neither complete nor release the key.
func TestAbandonedAttemptRecovered(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema(), LockTimeout: 200 * time.Millisecond})
	const key = "abandoned"
	a, first := f.started(key)
	if first.Outcome != idempotency.OutcomeExecute {
		t.Fatalf("first attempt: %+v", first)
	}
	b := f.intent(key)
	// Poll (by PostgreSQL's clock, through Begin itself) until the lock
	// has expired; Busy is read-only, so polling changes nothing.
	var second idempotency.Decision
	deadline := time.Now().Add(10 * time.Second)
	for {
		second = f.begin(key, b)
		if second.Outcome != idempotency.OutcomeBusy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock of %s never expired: %+v", idempotency.Config{Schema: testdb.Schema(), LockTimeout: 200 * time.Millisecond}.LockTimeout, second)
		}
		time.Sleep(min(second.RetryAfter, 50*time.Millisecond) + time.Millisecond)
	}
	if second.Outcome != idempotency.OutcomeRecover || second.Token == first.Token || second.OwnerIntentID != b || second.Attempts != 1 {
		t.Fatalf("after expiry: %+v, want recover with a new token for intent %d", second, b)
	}

	// The abandoned attempt wakes up and reports: refused, nothing written.
	_, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: first.Token, IntentID: a,
		Status: outbox.StatusSucceeded, Result: json.RawMessage(`{"stale":true}`)})
	var oe *idempotency.OwnershipError
	if !errors.Is(err, idempotency.ErrLostOwnership) || !errors.As(err, &oe) || oe.CurrentToken != second.Token || oe.State != idempotency.StateStarted {
		t.Fatalf("stale complete: %v, want ErrLostOwnership naming token %d", err, second.Token)
	}
	if err := f.store.Release(f.ctx, kind, key, first.Token); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("stale release: %v, want ErrLostOwnership", err)
	}
	if _, err := f.store.Extend(f.ctx, kind, key, first.Token); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("stale extend: %v, want ErrLostOwnership", err)
	}
	if k := f.key(key); k.State != idempotency.StateStarted || k.Token != second.Token || k.Result != nil {
		t.Fatalf("stale attempt changed the key: %+v", k)
	}
	if r := f.record(a); r.Status.Terminal() || r.Result != nil {
		t.Fatalf("stale attempt changed its intent: %+v", r)
	}

	// The recoverer found the effect at the destination and records it.
	f.complete(key, second, outbox.StatusSucceeded, `{"found":true}`)
	if d := f.begin(key, a); d.Outcome != idempotency.OutcomeDone || d.OwnerIntentID != b {
		t.Fatalf("after recovery: %+v, want done by intent %d", d, b)
	}
}

// Extend keeps a long attempt's lock fresh.
func TestExtend(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema(), LockTimeout: time.Minute})
	const key = "extend"
	d := f.begin(key, f.intent(key))
	f.expire(key)
	until, err := f.store.Extend(f.ctx, kind, key, d.Token)
	if err != nil {
		t.Fatal(err)
	}
	if !until.After(d.LockedUntil) {
		t.Fatalf("extended lock %s is not after %s", until, d.LockedUntil)
	}
	if got := f.begin(key, f.intent(key)); got.Outcome != idempotency.OutcomeBusy {
		t.Fatalf("after extend: %+v, want busy", got)
	}
}

// Complete writes key and intent in one transaction, and never overwrites
// an intent's final status.
func TestCompleteKeyAndIntent(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})

	t.Run("both recorded", func(t *testing.T) {
		t.Parallel()
		f := f.with(t)
		const key = "complete/ok"
		id, d := f.started(key)
		updated, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token, IntentID: id,
			Status: outbox.StatusSucceeded, Result: json.RawMessage(`{"message_id":"m"}`)})
		if err != nil || !updated {
			t.Fatalf("complete: updated=%v err=%v", updated, err)
		}
		k, r := f.key(key), f.record(id)
		if k.State != idempotency.StateCompleted || k.Status != outbox.StatusSucceeded || k.CompletedAt == nil || k.LockedUntil != nil {
			t.Fatalf("key %+v", k)
		}
		if r.Status != outbox.StatusSucceeded || r.CompletedAt == nil || string(r.Result) != `{"message_id": "m"}` || r.LastError != nil || r.Attempts != 1 {
			t.Fatalf("intent %+v (result %s)", r, r.Result)
		}
		// A retry after a lost response finds its own outcome: no error,
		// nothing written.
		updated, err = f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token, IntentID: id, Status: outbox.StatusSucceeded})
		if err != nil || updated {
			t.Fatalf("retried complete: updated=%v err=%v, want false, nil", updated, err)
		}
		// The same token with another outcome is refused.
		_, err = f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token, IntentID: id, Status: outbox.StatusFailed})
		if !errors.Is(err, idempotency.ErrLostOwnership) {
			t.Fatalf("complete with another outcome: %v, want ErrLostOwnership", err)
		}
	})

	t.Run("cancelled intent stays cancelled, key records the effect", func(t *testing.T) {
		t.Parallel()
		f := f.with(t)
		const key = "complete/cancelled"
		id, d := f.started(key)
		// An operator cancels while the effect is in flight.
		f.exec(`UPDATE fencegate.intents SET status = 'cancelled', updated_at = now() WHERE intent_id = $1`, id)
		updated, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token, IntentID: id,
			Status: outbox.StatusSucceeded, Result: json.RawMessage(`{"message_id":"m"}`), Error: ""})
		if err != nil || updated {
			t.Fatalf("complete on a cancelled intent: updated=%v err=%v, want false, nil", updated, err)
		}
		if r := f.record(id); r.Status != outbox.StatusCancelled || r.Result != nil || r.CompletedAt != nil {
			t.Fatalf("cancelled intent was touched: %+v", r)
		}
		if k := f.key(key); k.State != idempotency.StateCompleted || k.Status != outbox.StatusSucceeded {
			t.Fatalf("key %+v, want the effect recorded", k)
		}
	})

	t.Run("a failing intent write rolls the key back", func(t *testing.T) {
		t.Parallel()
		f := f.with(t)
		const key = "complete/rollback"
		id, d := f.started(key)
		// The intent vanishes (nothing in fencegate deletes intents; this
		// stands for any failure of the intent's half of the transaction).
		f.exec(`DELETE FROM fencegate.intents WHERE intent_id = $1`, id)
		_, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token, IntentID: id, Status: outbox.StatusSucceeded})
		if !errors.Is(err, idempotency.ErrIntentNotFound) {
			t.Fatalf("complete: %v, want ErrIntentNotFound", err)
		}
		if k := f.key(key); k.State != idempotency.StateStarted || k.Token != d.Token || k.Status != "" {
			t.Fatalf("key %+v, want still started: the key's half must roll back with the intent's", k)
		}
	})

	t.Run("wrong intent for the token", func(t *testing.T) {
		t.Parallel()
		f := f.with(t)
		const key = "complete/wrong-intent"
		_, d := f.started(key)
		other := f.intent("complete/other")
		_, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token, IntentID: other, Status: outbox.StatusSucceeded})
		if !errors.Is(err, idempotency.ErrInvalid) {
			t.Fatalf("complete: %v, want ErrInvalid", err)
		}
		if r := f.record(other); r.Status.Terminal() {
			t.Fatalf("other intent was completed: %+v", r)
		}
	})

	t.Run("superseded releases the key", func(t *testing.T) {
		t.Parallel()
		f := f.with(t)
		const key = "complete/superseded"
		id, d := f.started(key)
		f.complete(key, d, outbox.StatusSuperseded, "")
		if r := f.record(id); r.Status != outbox.StatusSuperseded {
			t.Fatalf("intent %+v, want superseded", r)
		}
		if _, err := f.store.Get(f.ctx, kind, key); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("get: %v, want ErrNotFound", err)
		}
		if got := f.begin(key, f.intent(key)); got.Outcome != idempotency.OutcomeExecute {
			t.Fatalf("after superseded: %+v, want execute", got)
		}
	})
}

// Begin refuses to start an attempt for an intent with a final status, and
// writes nothing.
func TestBeginTerminalIntent(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	const key = "terminal"
	id := f.intent(key)
	f.exec(`UPDATE fencegate.intents SET status = 'cancelled' WHERE intent_id = $1`, id)
	_, err := f.store.Begin(f.ctx, kind, key, f.fp, id)
	var te *idempotency.IntentTerminalError
	if !errors.Is(err, idempotency.ErrIntentTerminal) || !errors.As(err, &te) || te.Status != outbox.StatusCancelled {
		t.Fatalf("begin: %v, want ErrIntentTerminal (cancelled)", err)
	}
	if _, err := f.store.Get(f.ctx, kind, key); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("get: %v, want no key", err)
	}
	if _, err := f.store.Begin(f.ctx, kind, key, f.fp, 1<<40); !errors.Is(err, idempotency.ErrIntentNotFound) {
		t.Fatalf("begin for a missing intent: %v, want ErrIntentNotFound", err)
	}
	if _, err := f.store.Get(f.ctx, kind, key); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("get: %v, want no key", err)
	}
}

// An unknown outcome holds the key: nothing executes again until an
// operator releases it, and then only as a Recover.
func TestUnknownHoldsKey(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema(), LockTimeout: time.Millisecond})
	const key = "unknown"
	a, d := f.started(key)
	_, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token, IntentID: a,
		Status: outbox.StatusUnknown, Error: "connection reset after DATA"})
	if err != nil {
		t.Fatal(err)
	}
	if r := f.record(a); r.Status != outbox.StatusUnknown || r.LastError == nil || *r.LastError != "connection reset after DATA" {
		t.Fatalf("intent %+v, want unknown with the error", r)
	}
	// Even with a 1 ms lock timeout, however often anyone asks: held.
	for range 5 {
		got := f.begin(key, f.intent(key))
		if got.Outcome != idempotency.OutcomeBusy || !got.Held || got.OwnerIntentID != a {
			t.Fatalf("held key: %+v, want busy/held", got)
		}
	}
	if err := f.store.Release(f.ctx, kind, key, d.Token); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("release of a held key: %v, want ErrLostOwnership", err)
	}
	// The operator releases it: the next attempt recovers (looks up first).
	if err := f.store.Unhold(f.ctx, kind, key); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Unhold(f.ctx, kind, key); !errors.Is(err, idempotency.ErrNotHeld) {
		t.Fatalf("second unhold: %v, want ErrNotHeld", err)
	}
	if err := f.store.Unhold(f.ctx, kind, "no such key"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("unhold of a missing key: %v, want ErrNotFound", err)
	}
	_, got := f.started(key)
	if got.Outcome != idempotency.OutcomeRecover || got.Token == d.Token {
		t.Fatalf("after unhold: %+v, want recover with a new token", got)
	}
	// The attempt with the unknown outcome retries its Complete: refused.
	if _, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token, IntentID: a, Status: outbox.StatusUnknown}); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("old token after unhold: %v, want ErrLostOwnership", err)
	}
}

// Release after an attempt that did not perform the effect: the next Begin
// executes, and only the owner can release.
func TestRelease(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	const key = "release"
	a, d := f.started(key)
	if err := f.store.Release(f.ctx, kind, key, d.Token+1000); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("release with a wrong token: %v, want ErrLostOwnership", err)
	}
	if err := f.store.Release(f.ctx, kind, key, d.Token); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Release(f.ctx, kind, key, d.Token); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("second release: %v, want ErrLostOwnership", err)
	}
	if r := f.record(a); r.Status.Terminal() {
		t.Fatalf("release touched the intent: %+v", r)
	}
	// The retry of the same intent executes again, with a new token.
	again := f.begin(key, a)
	if again.Outcome != idempotency.OutcomeExecute || again.Token == d.Token || again.Attempts != 2 {
		t.Fatalf("after release: %+v, want execute, attempt 2", again)
	}
	if _, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token, IntentID: a, Status: outbox.StatusSucceeded}); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("released token completes: %v, want ErrLostOwnership", err)
	}
	f.complete(key, again, outbox.StatusSucceeded, "")
	if err := f.store.Release(f.ctx, kind, key, again.Token); !errors.Is(err, idempotency.ErrLostOwnership) {
		t.Fatalf("release of a completed key: %v, want ErrLostOwnership", err)
	}
}

// CompleteIntent records the outcome of an intent that owned no key, once.
func TestCompleteIntent(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	const key = "shared"
	a, b := f.intent(key), f.intent(key)
	f.complete(key, f.begin(key, a), outbox.StatusSucceeded, `{"message_id":"m"}`)
	d := f.begin(key, b)
	if d.Outcome != idempotency.OutcomeDone {
		t.Fatalf("%+v, want done", d)
	}
	updated, err := f.store.CompleteIntent(f.ctx, b, d.Status, d.Result, "")
	if err != nil || !updated {
		t.Fatalf("complete intent: %v %v", updated, err)
	}
	if r := f.record(b); r.Status != outbox.StatusSucceeded || string(r.Result) != `{"message_id": "m"}` || r.CompletedAt == nil {
		t.Fatalf("intent %+v", r)
	}
	updated, err = f.store.CompleteIntent(f.ctx, b, outbox.StatusFailed, nil, "late")
	if err != nil || updated {
		t.Fatalf("second complete intent: %v %v, want false, nil", updated, err)
	}
	if r := f.record(b); r.Status != outbox.StatusSucceeded || r.LastError != nil {
		t.Fatalf("final status was overwritten: %+v", r)
	}
	if _, err := f.store.CompleteIntent(f.ctx, 1<<40, outbox.StatusFailed, nil, ""); !errors.Is(err, idempotency.ErrIntentNotFound) {
		t.Fatalf("missing intent: %v, want ErrIntentNotFound", err)
	}
	if _, err := f.store.CompleteIntent(f.ctx, b, outbox.StatusCancelled, nil, ""); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("cancelled: %v, want ErrInvalid", err)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	long := string(make([]byte, 256))
	cases := []struct {
		name string
		call func() error
	}{
		{"empty kind", func() error { _, err := f.store.Begin(f.ctx, "", "k", f.fp, 1); return err }},
		{"empty key", func() error { _, err := f.store.Begin(f.ctx, kind, "", f.fp, 1); return err }},
		{"long key", func() error { _, err := f.store.Begin(f.ctx, kind, long, f.fp, 1); return err }},
		{"empty fingerprint", func() error { _, err := f.store.Begin(f.ctx, kind, "k", "", 1); return err }},
		{"intent id", func() error { _, err := f.store.Begin(f.ctx, kind, "k", f.fp, 0); return err }},
		{"complete status", func() error {
			_, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: "k", Token: 1, IntentID: 1, Status: outbox.StatusRelayed})
			return err
		}},
		{"complete result", func() error {
			_, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: "k", Token: 1, IntentID: 1, Status: outbox.StatusSucceeded, Result: json.RawMessage(`{`)})
			return err
		}},
		{"complete token", func() error {
			_, err := f.store.Complete(f.ctx, idempotency.Completion{Kind: kind, Key: "k", IntentID: 1, Status: outbox.StatusSucceeded})
			return err
		}},
		{"config lock timeout", func() error {
			_, err := idempotency.New(f.pool, idempotency.Config{Schema: testdb.Schema(), LockTimeout: -time.Second})
			return err
		}},
		{"config sweep batch", func() error {
			_, err := idempotency.New(f.pool, idempotency.Config{Schema: testdb.Schema(), SweepBatch: -1})
			return err
		}},
		{"config group max batch", func() error {
			_, err := idempotency.New(f.pool, idempotency.Config{Schema: testdb.Schema(), GroupCommit: true, GroupMaxBatch: -1})
			return err
		}},
		{"config group flushers", func() error {
			_, err := idempotency.New(f.pool, idempotency.Config{Schema: testdb.Schema(), GroupCommit: true, GroupFlushers: 65})
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.call(); !errors.Is(err, idempotency.ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
		})
	}
	if cfg := f.store.Config(); cfg.LockTimeout != 5*time.Minute || cfg.Retention != 30*24*time.Hour || cfg.SweepBatch != 1000 || cfg.Logger == nil {
		t.Fatalf("defaults: %+v", cfg)
	}
}
