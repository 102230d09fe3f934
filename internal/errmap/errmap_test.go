package errmap_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The contract's table (README: the CLI contract, the admin API's
// statuses): every code's exit code and HTTP status.
func TestCodeTable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code   errmap.Code
		exit   int
		status int
	}{
		{errmap.InvalidInput, 2, 400},
		{errmap.NotFound, 2, 404},
		{errmap.StaleEpoch, 3, 409},
		{errmap.LeaseHeld, 4, 409},
		{errmap.Conflict, 5, 422},
		{errmap.InvalidState, 5, 409},
		{errmap.Busy, 1, 503},
		{errmap.Unavailable, 1, 503},
		{errmap.AuthorityChanged, 1, 503},
		{errmap.UnsafeDatabase, 1, 500},
		{errmap.Internal, 1, 500},
		{errmap.BodyTooLarge, 2, 400},
		{errmap.Unauthorized, 1, 401},
		{errmap.Forbidden, 2, 403},
		{errmap.MethodNotAllowed, 1, 405},
		{errmap.Misdirected, 1, 421},
		{errmap.TooManyFailures, 1, 429},
		{errmap.Code("no_such_code"), 1, 500},
	} {
		if got := c.code.Exit(); got != c.exit {
			t.Errorf("%s: exit %d, want %d", c.code, got, c.exit)
		}
		if got := c.code.Status(); got != c.status {
			t.Errorf("%s: status %d, want %d", c.code, got, c.status)
		}
	}
}

// closedPort is a local address nothing listens on.
func closedPort(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t)) }

const emailPayload = `{"to":["alice@example.com"],"from":"reports@example.com","subject":"Nightly report","text":"all good"}`

func emailIntent(resource string, epoch int64, op, payload string) outbox.Intent {
	return outbox.Intent{Resource: resource, Epoch: epoch, OperationID: op, Kind: "email", Payload: json.RawMessage(payload)}
}

// Each code from the errors the libraries really return (a real
// PostgreSQL, a real closed port, a real NATS dial), with its exit code,
// HTTP status and the extra fields of the JSON error object.
func TestMapRealErrors(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	iss := coretest.Issuer(pool, lease.WithLockTimeout(100*time.Millisecond))
	ob := coretest.Outbox(t, pool)
	store := coretest.Store(t, pool)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	// A's lease, taken over by B after its expiry: epochs 1 (A) and 2 (B).
	a, err := iss.Acquire(ctx, "r", "A", lease.MinTTL)
	must(err)
	_, err = pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.resources SET lease_expires_at = now() - interval '1 second' WHERE resource_id = 'r'`))
	must(err)
	b, err := iss.Acquire(ctx, "r", "B", time.Hour)
	must(err)
	first, err := ob.Enqueue(ctx, emailIntent("r", b.Epoch, "op", emailPayload))
	must(err)

	_, renewStale := iss.Renew(ctx, "r", "A", a.Epoch, time.Hour)
	_, enqueueStale := ob.Enqueue(ctx, emailIntent("r", a.Epoch, "late", emailPayload))
	_, held := iss.Acquire(ctx, "r", "C", time.Hour)
	_, conflict := ob.Enqueue(ctx, emailIntent("r", b.Epoch, "op", `{"to":["bob@example.com"],"from":"reports@example.com","subject":"Other","text":"other"}`))
	_, leaseInvalid := iss.Acquire(ctx, "r", "", time.Hour)
	_, outboxInvalid := ob.Enqueue(ctx, emailIntent("r", 0, "op2", emailPayload))
	_, idemInvalid := idempotency.New(nil, idempotency.Config{Schema: testdb.Schema()})
	_, adminInvalid := admin.ParseListFilter("", "done", "", "", "")
	_, intentMissing := ob.Get(ctx, first.IntentID+1000)
	_, resourceMissing := admin.GetResource(ctx, pool, testdb.Schema(), "never-used")
	_, keyMissing := store.Get(ctx, "email", "no-such-key")

	// busy: a worker paused inside EnqueueTx keeps r's control row locked.
	tx, err := pool.Begin(ctx)
	must(err)
	_, err = ob.EnqueueTx(ctx, tx, emailIntent("r", b.Epoch, "paused", emailPayload))
	must(err)
	_, busy := iss.Renew(ctx, "r", "B", b.Epoch, time.Hour)
	bounded, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema(), LockTimeout: 50 * time.Millisecond})
	must(err)
	_, enqueueBusy := bounded.Enqueue(ctx, emailIntent("r", b.Epoch, "behind", emailPayload))
	_, batchBusy := bounded.EnqueueBatch(ctx, []outbox.Intent{emailIntent("r", b.Epoch, "behind", emailPayload)})
	must(tx.Rollback(ctx))

	// unavailable: nothing listens, a deadline passed, a standby, no NATS.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, refused := pgx.Connect(cctx, "postgres://nobody@"+closedPort(t)+"/none?connect_timeout=2")
	cancel()
	dctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	_, deadline := pool.Exec(dctx, `SELECT 1`)
	cancel()
	_, natsDown := nats.Connect("nats://"+closedPort(t), nats.Timeout(time.Second))
	// A connection the server ends (pg_terminate_backend: 57P01, then the
	// socket closes) under a session that uses it next.
	victim, err := pool.Acquire(ctx)
	must(err)
	var pid int
	must(victim.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid)
	must(err)
	_, terminated := victim.Exec(ctx, `SELECT 1`)
	_, afterTerminated := victim.Exec(ctx, `SELECT 1`)
	victim.Release()
	// A write refused as read-only (25006), as a standby (or a server with
	// default_transaction_read_only) refuses it; behind a pooler, a
	// connection checked once may reach a standby later.
	rocfg := pool.Config().Copy()
	rocfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	ropool, err := pgxpool.NewWithConfig(ctx, rocfg)
	must(err)
	defer ropool.Close()
	_, readOnly := coretest.Outbox(t, ropool).Enqueue(ctx, emailIntent("r", b.Epoch, "read-only", emailPayload))

	// authority_changed: a database restored from an older backup (its
	// recorded timeline is ahead of its own), in a database of its own.
	apool := testdb.New(t)
	_, err = apool.Exec(ctx, testdb.SQL(`UPDATE fencegate.epoch_authority SET timeline_id = timeline_id + 1`))
	must(err)
	var tli int64
	must(apool.QueryRow(ctx, testdb.SQL(`SELECT fencegate.fencegate_timeline_id()`)).Scan(&tli))
	_, authority := coretest.Issuer(apool).Acquire(ctx, "r", "A", time.Hour)

	// internal: a statement failing, a file missing, a plain error whose
	// text merely mentions a connection.
	_, syntax := pool.Exec(ctx, `SELEC 1`)
	_, fileMissing := os.Open(filepath.Join(t.TempDir(), "missing"))

	type fields = map[string]any
	for _, c := range []struct {
		name   string
		err    error
		code   errmap.Code
		exit   int
		status int
		field  string
		extra  fields
	}{
		{"lease renew, stale", renewStale, errmap.StaleEpoch, 3, 409, "",
			fields{"resource": "r", "supplied_epoch": a.Epoch, "current_epoch": b.Epoch}},
		{"outbox enqueue, stale", enqueueStale, errmap.StaleEpoch, 3, 409, "",
			fields{"resource": "r", "supplied_epoch": a.Epoch, "current_epoch": b.Epoch}},
		{"stale, wrapped", fmt.Errorf("worker: %w", enqueueStale), errmap.StaleEpoch, 3, 409, "",
			fields{"resource": "r", "supplied_epoch": a.Epoch, "current_epoch": b.Epoch}},
		{"lease held", held, errmap.LeaseHeld, 4, 409, "",
			fields{"resource": "r", "holder": "B", "current_epoch": b.Epoch}},
		{"operation id conflict", conflict, errmap.Conflict, 5, 422, "",
			fields{"resource": "r", "operation_id": "op", "intent_id": first.IntentID}},
		{"lease invalid", leaseInvalid, errmap.InvalidInput, 2, 400, "holder", nil},
		{"outbox invalid", outboxInvalid, errmap.InvalidInput, 2, 400, "epoch", nil},
		{"idempotency invalid", idemInvalid, errmap.InvalidInput, 2, 400, "pool", nil},
		{"admin invalid", adminInvalid, errmap.InvalidInput, 2, 400, "status", nil},
		{"intent not found", intentMissing, errmap.NotFound, 2, 404, "", nil},
		{"resource not found", resourceMissing, errmap.NotFound, 2, 404, "", nil},
		{"key not found", keyMissing, errmap.NotFound, 2, 404, "", nil},
		{"busy", busy, errmap.Busy, 1, 503, "", fields{"resource": "r"}},
		{"enqueue busy", enqueueBusy, errmap.Busy, 1, 503, "", fields{"resource": "r"}},
		{"enqueue batch busy", batchBusy, errmap.Busy, 1, 503, "", nil},
		{"authority changed", authority, errmap.AuthorityChanged, 1, 503, "",
			fields{"resource": "r", "reason": lease.ReasonTimelineBackwards, "recorded_timeline": tli + 1, "timeline": tli}},
		{"connection refused", refused, errmap.Unavailable, 1, 503, "", nil},
		{"deadline passed", deadline, errmap.Unavailable, 1, 503, "", nil},
		{"standby", fmt.Errorf("lease: acquire: %w", lease.ErrStandby), errmap.Unavailable, 1, 503, "", nil},
		{"outbox enqueue, read-only", readOnly, errmap.Unavailable, 1, 503, "", nil},
		{"connection terminated", terminated, errmap.Unavailable, 1, 503, "", nil},
		{"connection used after it was terminated", afterTerminated, errmap.Unavailable, 1, 503, "", nil},
		{"no NATS", natsDown, errmap.Unavailable, 1, 503, "", nil},
		{"SQL error", syntax, errmap.Internal, 1, 500, "", nil},
		{"file missing", fileMissing, errmap.Internal, 1, 500, "", nil},
		{"text only", errors.New("connection refused while dialing (only the text says so)"), errmap.Internal, 1, 500, "", nil},
		{"an *Error as is", fmt.Errorf("start: %w", errmap.New(errmap.UnsafeDatabase, "fsync=off")), errmap.UnsafeDatabase, 1, 500, "", nil},
	} {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		m := errmap.Map(c.err)
		if m.Code != c.code || m.Exit() != c.exit || m.Status() != c.status || m.Field != c.field {
			t.Errorf("%s: %v = code %s exit %d status %d field %q; want %s %d %d %q",
				c.name, c.err, m.Code, m.Exit(), m.Status(), m.Field, c.code, c.exit, c.status, c.field)
			continue
		}
		body := m.Body()
		if body["code"] != string(c.code) || body["message"] == "" {
			t.Errorf("%s: body %v", c.name, body)
		}
		if c.field != "" && body["field"] != c.field {
			t.Errorf("%s: body %v, want field %q", c.name, body, c.field)
		}
		for k, want := range c.extra {
			if got := body[k]; got != want {
				t.Errorf("%s: %s = %v (%T), want %v (%T)", c.name, k, got, got, want, want)
			}
		}
	}
	for _, err := range []error{renewStale, enqueueStale} {
		if !errors.Is(err, lease.ErrStaleEpoch) || !errors.Is(err, outbox.ErrStaleEpoch) {
			t.Errorf("%v does not match both lease.ErrStaleEpoch and outbox.ErrStaleEpoch", err)
		}
	}
	if m := errmap.Map(held); m.Extra["expires_at"] == nil {
		t.Errorf("lease_held has no expires_at: %v", m.Body())
	}
	if m := errmap.Map(authority); m.Extra["system_identifier"] == "" || m.Extra["system_identifier"] != m.Extra["recorded_system_identifier"] ||
		!strings.Contains(m.Message, "timeline went backwards") {
		t.Errorf("authority_changed: %v; want both system identifiers (the same, as strings) and the condition named", m.Body())
	}
	if m := errmap.Map(busy); m.RetryAfter != 1 {
		t.Errorf("busy: Retry-After %d, want 1", m.RetryAfter)
	}
	if errmap.Map(nil) != nil {
		t.Error("Map(nil) is not nil")
	}
}

// One sentinel: a stale epoch from the issuer and from the outbox match
// both packages' ErrStaleEpoch and fenceerr's; each package's invalid input
// matches every ErrInvalid; not-found sentinels stay distinct but all match
// fenceerr.ErrNotFound.
func TestOneVocabulary(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		&lease.StaleEpochError{Resource: "r", Supplied: 1, Current: 2},
		&outbox.StaleEpochError{Resource: "r", Supplied: 1, Current: 2},
	} {
		if !errors.Is(err, lease.ErrStaleEpoch) || !errors.Is(err, outbox.ErrStaleEpoch) || !errors.Is(err, fenceerr.ErrStaleEpoch) {
			t.Errorf("%v does not match every ErrStaleEpoch", err)
		}
		var ls *lease.StaleEpochError
		var os *outbox.StaleEpochError
		if !errors.As(err, &ls) || !errors.As(err, &os) {
			t.Errorf("%v is not both packages' *StaleEpochError", err)
		}
	}
	for _, err := range []error{
		&lease.InvalidError{Field: "f", Message: "m"},
		&outbox.ValidationError{Field: "f", Message: "m"},
		&admin.InputError{Field: "f", Message: "m"},
		&idempotency.InvalidError{Field: "f", Message: "m"},
	} {
		for _, s := range []error{lease.ErrInvalid, outbox.ErrInvalid, admin.ErrInvalid, idempotency.ErrInvalid, fenceerr.ErrInvalid} {
			if !errors.Is(err, s) {
				t.Errorf("%v does not match %v", err, s)
			}
		}
		if err.Error() != "f: m" {
			t.Errorf("%v: text changed", err)
		}
	}
	nf := []error{outbox.ErrNotFound, admin.ErrResourceNotFound, idempotency.ErrNotFound, idempotency.ErrIntentNotFound}
	for i, a := range nf {
		if !errors.Is(a, fenceerr.ErrNotFound) {
			t.Errorf("%v does not match fenceerr.ErrNotFound", a)
		}
		for j, b := range nf {
			if i != j && errors.Is(a, b) {
				t.Errorf("%v matches %v", a, b)
			}
		}
	}
	if got := errmap.Map(admin.ErrResourceNotFound).Status(); got != http.StatusNotFound {
		t.Errorf("resource not found: %d", got)
	}
}
