// Package coretest builds the core's clients for a test: the outbox
// client, the idempotency store and the lease issuer on a test's pool, in
// the test schema (testdb.Schema), so that a test of a package built on
// the core sets them up in one line each and never names the schema
// itself; and Refused, the check that bad input is refused in the core's
// error vocabulary.
package coretest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Outbox returns an outbox client on pool, in the test schema; the test
// fails when it cannot be built.
func Outbox(t testing.TB, pool *pgxpool.Pool) *outbox.Client {
	t.Helper()
	ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema()})
	if err != nil {
		t.Fatalf("outbox client: %v", err)
	}
	return ob
}

// Store returns an idempotency store on pool, in the test schema; the
// test fails when it cannot be built.
func Store(t testing.TB, pool *pgxpool.Pool) *idempotency.Store {
	t.Helper()
	store, err := idempotency.New(pool, idempotency.Config{Schema: testdb.Schema()})
	if err != nil {
		t.Fatalf("idempotency store: %v", err)
	}
	return store
}

// Issuer returns a lease issuer on pool, in the test schema, with opts
// after the schema.
func Issuer(pool *pgxpool.Pool, opts ...lease.Option) *lease.Issuer {
	return lease.NewIssuer(pool, append([]lease.Option{lease.WithSchema(testdb.Schema())}, opts...)...)
}

// Key returns the idempotency key of intent id (by its kind and key), or
// nil when the key has no row.
func Key(t testing.TB, ob *outbox.Client, store *idempotency.Store, id int64) *idempotency.Key {
	t.Helper()
	rec, err := ob.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("intent %d: %v", id, err)
	}
	k, err := store.Get(context.Background(), rec.Kind, rec.IdempotencyKey)
	if errors.Is(err, idempotency.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("key of intent %d: %v", id, err)
	}
	return k
}

// Records returns the intents ids that exist, read from ob a thousand at a
// time, each read bounded by 30 s: the fault tests poll thousands of
// intents through a database that may be failing over, and retry on an
// error.
func Records(ob *outbox.Client, ids []int64) (map[int64]*outbox.Record, error) {
	out := make(map[int64]*outbox.Record, len(ids))
	for chunk := range slices.Chunk(ids, 1000) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		m, err := ob.GetMany(ctx, chunk)
		cancel()
		if err != nil {
			return nil, err
		}
		maps.Copy(out, m)
	}
	return out, nil
}

// Refused checks that each call returns a *fenceerr.InvalidError whose
// Field is the call's key (the field or argument that is wrong), logs how
// many did, and fails the test when one did not or none was checked.
func Refused(t testing.TB, calls map[string]func() error) {
	t.Helper()
	refused := 0
	for field, call := range calls {
		var inv *fenceerr.InvalidError
		if err := call(); !errors.As(err, &inv) || inv.Field != field {
			t.Errorf("with a bad %s: %v, want an InvalidError naming it", field, err)
			continue
		}
		refused++
	}
	if refused == 0 {
		t.Fatal("no bad input was refused")
	}
	t.Logf("%d of %d bad inputs refused, each naming its field", refused, len(calls))
}
