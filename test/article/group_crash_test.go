package article

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/failpoint"
	ft "github.com/fencegate/fencegate/internal/testkit/faulttest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Kill -9 the gateway inside a group-committed Begin and inside a
// group-committed Complete (shared transactions of several attempts,
// written and not committed): after a restart every intent succeeds and
// every file is published exactly once — the shared transaction is lost
// as a whole, and what it held back (a Begin: no effect had started under
// it; a Complete: effects that happened) is found again through the keys,
// as for a single attempt.
func TestCrashInsideGroupCommit(t *testing.T) {
	t.Parallel()
	for _, point := range []string{failpoint.InsideGroupBegin, failpoint.InsideGroupComplete} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ns := natstest.StartProcess(t)
			root := t.TempDir()
			ctx := context.Background()
			pool := e.pool()
			ft.Expect(t, e.gw("", "migrate"), 0, "")
			l, err := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())).Acquire(ctx, "r", "A", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema(), DisableNotify: true})
			if err != nil {
				t.Fatal(err)
			}
			// A backlog committed before the gateway starts, so that the
			// relay publishes it in a burst and the attempts arrive
			// together: their Begins and Completes share transactions.
			const n = 100
			ids := make([]int64, n)
			for i := range n {
				p, _ := json.Marshal(map[string]string{"target": fmt.Sprintf("out/%03d.txt", i), "content": fmt.Sprintf("v%d", i)})
				r, err := ob.Enqueue(ctx, outbox.Intent{Resource: "r", Epoch: l.Epoch, OperationID: fmt.Sprintf("file-%03d", i),
					Kind: "file", Payload: p})
				if err != nil {
					t.Fatal(err)
				}
				ids[i] = r.IntentID
			}
			args := []string{"--adapters", "file", "--file-root", root}
			p := e.run(point+"=crash", ns.URL, args...)
			waitKilled(t, p, point, 2*time.Minute)

			expireAbandoned(t, pool)
			e.run("", ns.URL, args...)
			for _, id := range ids {
				if st := e.waitTerminal(id, 2*time.Minute); st["status"] != "succeeded" {
					t.Fatalf("intent %d ended %v", id, st)
				}
			}
			for i := range n {
				target := fmt.Sprintf("out/%03d.txt", i)
				if pubs := publications(t, root, target, fmt.Sprintf("r/file-%03d", i)); pubs != 1 {
					t.Errorf("%s published %d times, want once", target, pubs)
				}
			}
		})
	}
}
