package operator

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// env is an Operator over a fresh database with the clients that write
// what it reads: the outbox (intents), the issuer (epochs) and the
// idempotency store (an adapter's attempts).
type env struct {
	t     *testing.T
	pool  *pgxpool.Pool
	op    *Operator
	ob    *outbox.Client
	store *idempotency.Store
}

func setup(t *testing.T) *env {
	t.Helper()
	t.Parallel()
	pool := testdb.New(t)
	op, err := New(pool, testdb.Schema())
	if err != nil {
		t.Fatal(err)
	}
	ob := coretest.Outbox(t, pool)
	store := coretest.Store(t, pool)
	if _, err := coretest.Issuer(pool).Advance(context.Background(), "r", 1); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, pool: pool, op: op, ob: ob, store: store}
}

// seed enqueues an email intent on resource r (epoch 1) and, unless it is
// pending, sets its status as the adapter runtime would, with the effect
// the runtime records with it: an unknown outcome makes it possible, a
// success done.
func (e *env) seed(op string, status outbox.Status, lastError string) int64 {
	e.t.Helper()
	res, err := e.ob.Enqueue(context.Background(), outbox.Intent{Resource: "r", Epoch: 1, OperationID: op, Kind: "email",
		Payload: []byte(`{"to":"alice@example.com","from":"reports@example.com","subject":"hi","text":"body"}`)})
	if err != nil {
		e.t.Fatal(err)
	}
	if status != outbox.StatusPending {
		if _, err := e.pool.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET status = $2, last_error = nullif($3, ''),
			completed_at = CASE WHEN $2 IN ('failed', 'unknown', 'succeeded') THEN now() END,
			effect = CASE WHEN $2 = 'succeeded' THEN 'done' WHEN $2 = 'unknown' AND effect = 'none' THEN 'possible' ELSE effect END
			WHERE intent_id = $1`), res.IntentID, string(status), lastError); err != nil {
			e.t.Fatal(err)
		}
	}
	return res.IntentID
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	return testdb.Int(e.t, e.pool, sql, args...)
}

func (e *env) status(id int64) outbox.Status {
	e.t.Helper()
	rec, err := e.ob.Get(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return rec.Status
}

func (e *env) attempts(id int64) int {
	e.t.Helper()
	return e.count(`SELECT attempts FROM fencegate.intents WHERE intent_id = $1`, id)
}

// key returns the intent's idempotency key, nil when there is none.
func (e *env) key(id int64) *idempotency.Key {
	e.t.Helper()
	return coretest.Key(e.t, e.ob, e.store, id)
}

// New and NewReader refuse a schema that is not a schema's name, naming
// the field.
func TestNewRefusesBadSchema(t *testing.T) {
	pool := testdb.New(t)
	for _, schema := range []string{"Bad-Schema", "pg_catalog", `a"b`} {
		op, err := New(pool, schema)
		var ie *fenceerr.InvalidError
		if op != nil || !errors.As(err, &ie) || ie.Field != "schema" {
			t.Errorf("New(%q) = %v, %v; want an invalid-input error naming schema", schema, op, err)
		}
		if op, err := NewReader(pool, schema); op != nil || !errors.As(err, &ie) || ie.Field != "schema" {
			t.Errorf("NewReader(%q) = %v, %v; want an invalid-input error naming schema", schema, op, err)
		}
	}
}

// New refuses a nil pool, naming it: it made an Operator that panicked at
// its first call. An Operator that only reads (NewReader) reads, and
// refuses to act, naming pool.
func TestNilPoolRefused(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	id := e.seed("op", outbox.StatusFailed, "boom")
	r, err := NewReader(e.pool, testdb.Schema())
	if err != nil {
		t.Fatal(err)
	}
	if d, err := r.Get(ctx, id); err != nil || d.Status != outbox.StatusFailed {
		t.Fatalf("a reader's Get = %+v, %v", d, err)
	}
	for name, call := range map[string]func() error{
		"New(nil)": func() error { _, err := New(nil, ""); return err },
		"Apply": func() error {
			_, err := r.Apply(ctx, ActionRequest{IntentID: id, Action: ActionRetry, Actor: "t"})
			return err
		},
		"Bulk": func() error {
			_, err := r.Bulk(ctx, BulkRequest{Action: ActionRetry, Status: outbox.StatusFailed, Actor: "t"})
			return err
		},
		"Epochs": func() error { _, err := r.Epochs(ctx, "r", 0); return err },
	} {
		t.Run(name, func(t *testing.T) { coretest.Refused(t, map[string]func() error{"pool": call}) })
	}
	coretest.Refused(t, map[string]func() error{"q": func() error { _, err := NewReader(nil, ""); return err }})
	if d, _ := e.op.Get(ctx, id); d.Status != outbox.StatusFailed {
		t.Fatalf("the refused actions changed the intent: %+v", d)
	}
}
