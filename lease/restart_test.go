package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
)

// Epochs survive a restart of PostgreSQL — clean (fast shutdown) and a
// crash (SIGKILL of the postmaster) — and keep growing afterwards. This test
// runs its own durable cluster, since it restarts it.
func TestEpochsSurvivePostgresRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, pool := startCluster(t, ctx, pgcluster.Options{Durable: true})
	iss := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()))
	want := map[string]int64{}
	grant := func(tag string) {
		for _, r := range []string{"a", "b", "c"} {
			if _, err := iss.Advance(ctx, r, want[r]+3); err != nil {
				t.Fatalf("%s: advance %s: %v", tag, r, err)
			}
			// An Acquire right after also increments it, in the same durable way.
			l, err := iss.Acquire(ctx, r, "holder-"+tag, time.Minute)
			if err != nil {
				t.Fatalf("%s: acquire %s: %v", tag, r, err)
			}
			if l.Epoch != want[r]+4 {
				t.Fatalf("%s: epoch of %s = %d, want %d", tag, r, l.Epoch, want[r]+4)
			}
			want[r] = l.Epoch
		}
	}
	check := func(tag string) {
		// The pool reconnects on its own; allow the server a moment to
		// accept connections after recovery.
		deadline := time.Now().Add(30 * time.Second)
		for {
			ok := true
			for r, e := range want {
				got, err := iss.Get(ctx, r)
				if err != nil {
					if time.Now().After(deadline) {
						t.Fatalf("%s: read %s: %v", tag, r, err)
					}
					ok = false
					break
				}
				if got.Epoch != e {
					t.Fatalf("%s: epoch of %s = %d after restart, want %d", tag, r, got.Epoch, e)
				}
			}
			if ok {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	grant("before")
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	check("after clean restart")
	grant("after-clean")

	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	// Kill returns once no process of the old server is left: the start
	// succeeds at once.
	if err := c.StartAgain(ctx); err != nil {
		t.Fatal(err)
	}
	check("after crash")
	grant("after-crash")
	check("final")
}
