package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/lease"
)

func TestMain(m *testing.M) { adaptertest.Main(m) }

// The worker commits both intents at its epoch; a rerun of the same day
// gets a newer epoch and finds both committed (duplicates, nothing new);
// while another holder's lease is live it is refused and stores nothing.
func TestWorker(t *testing.T) {
	t.Parallel()
	url := adaptertest.NewDatabase(t)
	ctx := context.Background()
	first, err := run(ctx, url, adaptertest.Schema(), "2026-12-01", "worker-a", "alice@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Intents) != 2 || first.Intents[0].Duplicate || first.Intents[1].Duplicate {
		t.Fatalf("first run: %+v", first)
	}
	again, err := run(ctx, url, adaptertest.Schema(), "2026-12-01", "worker-a", "alice@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if again.Epoch <= first.Epoch || !again.Intents[0].Duplicate || !again.Intents[1].Duplicate ||
		again.Intents[0].IntentID != first.Intents[0].IntentID {
		t.Fatalf("rerun: %+v after %+v; want a newer epoch and the same intents, duplicates", again, first)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := lease.NewIssuer(pool, lease.WithSchema(adaptertest.Schema())).Acquire(ctx, "nightly-report", "worker-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	_, err = run(ctx, url, adaptertest.Schema(), "2026-12-02", "worker-a", "alice@example.com")
	var held *lease.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("while worker-b holds the lease: %v, want *lease.HeldError", err)
	}
	var n int
	if err := pool.QueryRow(ctx, adaptertest.SQL(`SELECT count(*) FROM fencegate.intents`)).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d intents stored (%v), want the first day's 2", n, err)
	}
}
