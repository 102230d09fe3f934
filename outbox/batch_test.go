package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

const otherEmailPayload = `{"to":["bob@example.com"],"from":"reports@example.com","subject":"Other","text":"x"}`

// A mixed batch: each intent gets the answer Enqueue would give it alone,
// and exactly the new, current ones are stored.
func TestEnqueueBatchMixed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "r", "A", time.Minute)
	l2 := b.acquire(t, "r2", "A", time.Minute)
	dup, err := b.client.Enqueue(ctx, emailIntent("r", l.Epoch, "existing"))
	if err != nil {
		t.Fatal(err)
	}
	conf, err := b.client.Enqueue(ctx, emailIntent("r", l.Epoch, "existing-2"))
	if err != nil {
		t.Fatal(err)
	}
	// A retry of an intent committed under an older epoch: still a duplicate.
	if _, err := b.issuer.Advance(ctx, "r", l.Epoch+1); err != nil {
		t.Fatal(err)
	}
	cur := l.Epoch + 1

	other := emailIntent("r", cur, "in-batch")
	other.Payload = json.RawMessage(otherEmailPayload)
	conflicting := emailIntent("r", l.Epoch, "existing-2")
	conflicting.Payload = json.RawMessage(otherEmailPayload)
	batch := []outbox.Intent{
		0:  emailIntent("r", l.Epoch, "stale-new"),                                                            // stale: epoch moved on
		1:  conflicting,                                                                                       // conflict with an existing intent
		2:  emailIntent("r", l.Epoch, "existing"),                                                             // duplicate (old epoch, retry)
		3:  emailIntent("r", cur, "in-batch"),                                                                 // new
		4:  {Resource: "", Epoch: 1, OperationID: "x", Kind: "email", Payload: json.RawMessage(emailPayload)}, // invalid
		5:  emailIntent("r2", l2.Epoch, "in-batch"),                                                           // new, other resource
		6:  emailIntent("r", cur, "in-batch"),                                                                 // duplicate of 3
		7:  other,                                                                                             // conflict with 3
		8:  emailIntent("never-leased", 1, "n"),                                                               // stale: no epoch issued
		9:  emailIntent("r", cur+1, "future"),                                                                 // stale: never issued
		10: emailIntent("r", cur-1, "late-repeat"),                                                            // stale…
		11: emailIntent("r", cur, "late-repeat"),                                                              // …then current: inserted
		12: emailIntent("r", cur-1, "late-repeat"),                                                            // duplicate of 11 (a retry)
	}
	res, err := b.client.EnqueueBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(batch) {
		t.Fatalf("%d results for %d intents", len(res), len(batch))
	}
	var stale *outbox.StaleEpochError
	var cerr *outbox.ConflictError
	var verr *outbox.ValidationError
	expectStale := func(i int, current int64) {
		t.Helper()
		if !errors.As(res[i].Err, &stale) || stale.Current != current || stale.Supplied != batch[i].Epoch {
			t.Fatalf("item %d: %+v; want stale, current %d", i, res[i], current)
		}
	}
	expectStale(0, cur)
	if !errors.As(res[1].Err, &cerr) || cerr.IntentID != conf.IntentID {
		t.Fatalf("item 1: %+v; want conflict with intent %d", res[1], conf.IntentID)
	}
	if res[2].Err != nil || !res[2].Duplicate || res[2].IntentID != dup.IntentID {
		t.Fatalf("item 2: %+v; want duplicate of %d", res[2], dup.IntentID)
	}
	if res[3].Err != nil || res[3].Duplicate || res[3].IntentID == 0 || res[3].Status != outbox.StatusPending {
		t.Fatalf("item 3: %+v; want inserted", res[3])
	}
	if !errors.As(res[4].Err, &verr) || verr.Field != "resource" {
		t.Fatalf("item 4: %+v; want invalid resource", res[4])
	}
	if res[5].Err != nil || res[5].Duplicate || res[5].IntentID == 0 || res[5].IntentID == res[3].IntentID {
		t.Fatalf("item 5: %+v; want a new intent", res[5])
	}
	if res[6].Err != nil || !res[6].Duplicate || res[6].IntentID != res[3].IntentID {
		t.Fatalf("item 6: %+v; want duplicate of item 3 (%d)", res[6], res[3].IntentID)
	}
	if !errors.As(res[7].Err, &cerr) || cerr.IntentID != res[3].IntentID {
		t.Fatalf("item 7: %+v; want conflict with item 3", res[7])
	}
	expectStale(8, 0)
	expectStale(9, cur)
	expectStale(10, cur)
	if res[11].Err != nil || res[11].Duplicate || res[11].IntentID == 0 {
		t.Fatalf("item 11: %+v; want inserted", res[11])
	}
	if res[12].Err != nil || !res[12].Duplicate || res[12].IntentID != res[11].IntentID {
		t.Fatalf("item 12: %+v; want duplicate of item 11", res[12])
	}

	// Stored: the two existing intents and the three new ones, each with
	// the epoch and content of the item that inserted it.
	if n := countIntents(t, b.pool, ""); n != 5 {
		t.Fatalf("intents = %d; want 5", n)
	}
	for _, i := range []int{3, 5, 11} {
		rec, err := b.client.Get(ctx, res[i].IntentID)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Resource != batch[i].Resource || rec.OperationID != batch[i].OperationID || rec.Epoch != batch[i].Epoch {
			t.Fatalf("item %d stored as %+v", i, rec)
		}
	}
	// A batch of nothing valid touches nothing and is no error.
	res, err = b.client.EnqueueBatch(ctx, []outbox.Intent{{}})
	if err != nil || len(res) != 1 || !errors.Is(res[0].Err, outbox.ErrInvalid) {
		t.Fatalf("all-invalid batch = %+v, %v", res, err)
	}
	if res, err := b.client.EnqueueBatch(ctx, nil); err != nil || len(res) != 0 {
		t.Fatalf("empty batch = %+v, %v", res, err)
	}
}

// Concurrent batches over overlapping resources, in random orders, never
// deadlock: the batch function locks resources in sorted order.
func TestEnqueueBatchConcurrentNoDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const nres, workers, rounds, size = 6, 8, 30, 12
	epochs := map[string]int64{}
	for i := range nres {
		res := fmt.Sprintf("res-%d", i)
		l := b.acquire(t, res, "A", time.Hour)
		epochs[res] = l.Epoch
	}
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for r := range rounds {
				batch := make([]outbox.Intent, size)
				for i := range batch {
					res := fmt.Sprintf("res-%d", rng.IntN(nres))
					batch[i] = emailIntent(res, epochs[res], fmt.Sprintf("w%d-r%d-i%d", w, r, i))
				}
				results, err := b.client.EnqueueBatch(ctx, batch)
				if err != nil {
					errc <- err
					return
				}
				for i, res := range results {
					if res.Err != nil || res.Duplicate {
						errc <- fmt.Errorf("worker %d round %d item %d: %+v", w, r, i, res)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if n := countIntents(t, b.pool, ""); n != workers*rounds*size {
		t.Fatalf("intents = %d; want %d", n, workers*rounds*size)
	}
}

// The race test's checkers, run against group commit and EnqueueBatch: no
// accepted intent carries an epoch older than one granted before it
// started, or than the current one when it committed.
func TestNoStaleUnderTakeoversGroupAndBatch(t *testing.T) {
	t.Parallel()
	t.Run("group", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		gc, err := outbox.New(b.pool, outbox.Config{Schema: testdb.Schema(), GroupCommit: true})
		if err != nil {
			t.Fatal(err)
		}
		raceWith(t, b, gc.Enqueue, 2*time.Second)
	})
	t.Run("batch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Each caller's intent goes into a batch of its own plus a filler on
		// another resource, so batches hold several resources.
		raceWith(t, b, func(ctx context.Context, in outbox.Intent) (outbox.Result, error) {
			filler := emailIntent("filler-"+in.Resource, 1, "f-"+in.OperationID)
			res, err := b.client.EnqueueBatch(ctx, []outbox.Intent{filler, in})
			if err != nil {
				return outbox.Result{}, err
			}
			return res[1].Result, res[1].Err
		}, 2*time.Second)
	})
}

// Group commit: many concurrent callers share transactions, and each gets
// its own answer: inserted, duplicate, stale or conflict.
func TestGroupCommitPerCallerAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	gc, err := outbox.New(b.pool, outbox.Config{Schema: testdb.Schema(), GroupCommit: true, GroupFlushers: 1})
	if err != nil {
		t.Fatal(err)
	}
	l := b.acquire(t, "r", "A", time.Hour)
	existing, err := gc.Enqueue(ctx, emailIntent("r", l.Epoch, "existing"))
	if err != nil || existing.Duplicate {
		t.Fatalf("first enqueue = %+v, %v", existing, err)
	}
	const n = 200
	type answer struct {
		res outbox.Result
		err error
	}
	answers := make([]answer, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-gate
			var in outbox.Intent
			switch i % 4 {
			case 0, 1:
				in = emailIntent("r", l.Epoch, fmt.Sprintf("new-%d", i))
			case 2:
				in = emailIntent("r", l.Epoch+1+int64(i%8/6), fmt.Sprintf("stale-%d", i)) // never issued: stale
			case 3:
				if i%8 == 3 {
					in = emailIntent("r", l.Epoch, "existing")
				} else {
					in = emailIntent("r", l.Epoch, "existing")
					in.Payload = json.RawMessage(otherEmailPayload)
				}
			}
			res, err := gc.Enqueue(ctx, in)
			answers[i] = answer{res, err}
		})
	}
	close(gate)
	wg.Wait()
	inserted := 0
	for i, a := range answers {
		switch {
		case i%4 <= 1:
			if a.err != nil || a.res.Duplicate || a.res.IntentID == 0 {
				t.Fatalf("caller %d: %+v %v; want inserted", i, a.res, a.err)
			}
			inserted++
		case i%4 == 2:
			if !errors.Is(a.err, outbox.ErrStaleEpoch) {
				t.Fatalf("caller %d: %+v %v; want stale", i, a.res, a.err)
			}
		case i%8 == 3:
			if a.err != nil || !a.res.Duplicate || a.res.IntentID != existing.IntentID {
				t.Fatalf("caller %d: %+v %v; want duplicate", i, a.res, a.err)
			}
		default:
			if !errors.Is(a.err, outbox.ErrOperationConflict) {
				t.Fatalf("caller %d: %+v %v; want conflict", i, a.res, a.err)
			}
		}
	}
	if got := countIntents(t, b.pool, ""); got != inserted+1 {
		t.Fatalf("intents = %d; want %d", got, inserted+1)
	}
	// The calls did share transactions.
	var txs int
	if err := b.pool.QueryRow(ctx, testdb.SQL(`SELECT count(DISTINCT xmin::text) FROM fencegate.intents`)).Scan(&txs); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d intents in %d transactions", inserted+1, txs)
	if txs >= inserted+1 {
		t.Fatalf("group commit used %d transactions for %d intents", txs, inserted+1)
	}
	// A caller whose context is already done gets its error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := gc.Enqueue(cctx, emailIntent("r", l.Epoch, "cancelled")); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", err)
	}
}
