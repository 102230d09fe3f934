package devenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// The demo's scenario (the article's): resource, workers, lease TTL, target.
const (
	demoResource = "nightly-report"
	demoHolderA  = "worker-A"
	demoHolderB  = "worker-B"
	demoTTL      = 2 * time.Second
	// demoPause is how long A pauses: past its lease, as in the article.
	demoPause  = demoTTL + time.Second
	demoTarget = "reports/nightly.txt"
	// demoWait bounds waiting for B's intents to finish.
	demoWait = time.Minute
)

// demoOpID is the operation id of a worker's write in the demo; epochs grow
// on every run against a kept database, so the ids never repeat.
func demoOpID(worker, what string, epoch int64) string {
	return fmt.Sprintf("%s-%s-epoch-%d", worker, what, epoch)
}

// runDemo replays the article's scenario with the real library calls,
// in-process: A takes a lease and pauses past it, B takes over and
// publishes through the outbox, dispatcher, NATS and the adapters, and A's
// late write is fenced out — by the outbox's epoch check and, had it got
// that far, by the file destination's own fence.
func (d *devEnv) runDemo(ctx context.Context) error {
	log := d.log.With("component", "demo")
	// The demo's workers count on the gateway's registry, so dev's
	// /metrics shows what they did: the takeover, A's refused write.
	reg := d.stack.Registry()
	issuer := lease.NewIssuer(d.pool, lease.WithSchema(d.opts.Schema), lease.WithRegisterer(reg))
	ob, err := outbox.New(d.pool, outbox.Config{Schema: d.opts.Schema, Logger: d.log, Registerer: reg})
	if err != nil {
		return err
	}
	log.Info(fmt.Sprintf("demo: the article's scenario on resource %q: worker A pauses past its lease, worker B takes over", demoResource))

	// 1. A takes the lease.
	la, err := demoAcquire(ctx, issuer, log, demoHolderA)
	if err != nil {
		return err
	}
	n := la.Epoch
	log.Info(fmt.Sprintf("demo: A took the lease: epoch %d, TTL %s", n, demoTTL), "worker", "A", "epoch", n)

	// 1b. While its lease is live, A commits the publication of its report
	// (fence commit: it was decided while epoch n was current). The write
	// is then held up in transit — a slow relay, a partitioned network —
	// which the demo stands in for by parking the intent under a claim of
	// a dispatcher that does not exist. It arrives after B's, below.
	aLateOp := demoOpID("A", "report-in-transit", n)
	aLateID, err := d.demoEnqueueParked(ctx, ob, outbox.Intent{
		Resource: demoResource, Epoch: n, OperationID: aLateOp, Kind: file.Kind, Fence: outbox.FenceCommit,
		Payload: demoJSON(map[string]any{"target": demoTarget, "content": fmt.Sprintf("report by A, epoch %d", n)}),
	})
	if err != nil {
		return fmt.Errorf("A's publication: %w", err)
	}
	log.Info(fmt.Sprintf("demo: A committed the publication of %s with epoch %d (intent %d) while its lease was live; the write is delayed in transit",
		demoTarget, n, aLateID), "worker", "A", "intent_id", aLateID)

	// 2. A pauses (a GC pause, a stalled VM): here the sleep is the
	// scenario. Its lease runs out meanwhile.
	pausedAt := time.Now()
	log.Info(fmt.Sprintf("demo: A pauses (GC pause, stalled VM) for %s before its next write; its %s lease runs out", demoPause, demoTTL), "worker", "A")

	// 3. B, waiting for the lease, gets it once A's has expired — by
	// PostgreSQL's clock — with the next epoch.
	lb, err := demoAcquire(ctx, issuer, log, demoHolderB)
	if err != nil {
		return err
	}
	m := lb.Epoch
	log.Info(fmt.Sprintf("demo: B took over: epoch %d (A still believes it holds epoch %d)", m, n), "worker", "B", "epoch", m)

	// 4. B publishes the report and emails it, both through the outbox.
	fileOp := demoOpID("B", "report", m)
	fres, err := ob.Enqueue(ctx, outbox.Intent{
		Resource: demoResource, Epoch: m, OperationID: fileOp, Kind: file.Kind,
		Payload: demoJSON(map[string]any{"target": demoTarget, "content": fmt.Sprintf("report by B, epoch %d", m)}),
	})
	if err != nil {
		return fmt.Errorf("B's file intent: %w", err)
	}
	log.Info(fmt.Sprintf("demo: B enqueued the publication of %s with epoch %d: intent %d", demoTarget, m, fres.IntentID),
		"worker", "B", "intent_id", fres.IntentID, "operation_id", fileOp)
	day := time.Now().UTC().Format("2006-01-02")
	mailOp := demoOpID("B", "email", m)
	mres, err := ob.Enqueue(ctx, outbox.Intent{
		Resource: demoResource, Epoch: m, OperationID: mailOp, Kind: email.Kind,
		// The business key: this day's report goes to alice once, whoever
		// sends it and however often the job runs (a second run against a
		// kept database records the first run's result and sends nothing).
		// Its content must therefore be the same for every sender: the
		// same key with other content is a conflict, never sent.
		IdempotencyKey: fmt.Sprintf("nightly-report/%s/alice@example.com", day),
		Payload: demoJSON(map[string]any{
			"to": "alice@example.com", "from": "reports@example.com",
			"subject": "Nightly report " + day,
			"text":    fmt.Sprintf("The nightly report for %s is published at %s.", day, demoTarget),
		}),
	})
	if err != nil {
		return fmt.Errorf("B's email intent: %w", err)
	}
	log.Info(fmt.Sprintf("demo: B enqueued the email to alice@example.com with epoch %d: intent %d", m, mres.IntentID),
		"worker", "B", "intent_id", mres.IntentID, "operation_id", mailOp)

	// 4b. ... and announces this publication (epoch m) with a webhook: the
	// receiver sees B's epoch in Fencegate-Epoch, and the key is this
	// publication's (the receiver's address differs from run to run, and
	// the same key with other content would be a conflict).
	hookOp := demoOpID("B", "webhook", m)
	hookKey := fmt.Sprintf("nightly-report/%s/published-epoch-%d", day, m)
	hres, err := ob.Enqueue(ctx, outbox.Intent{
		Resource: demoResource, Epoch: m, OperationID: hookOp, Kind: webhook.Kind,
		IdempotencyKey: hookKey,
		Payload: demoJSON(map[string]any{
			"url":        d.echo.URL() + "/hooks/report-published",
			"body":       map[string]any{"report": demoTarget, "day": day},
			"lookup_url": d.echo.URL() + "/lookup",
		}),
	})
	if err != nil {
		return fmt.Errorf("B's webhook intent: %w", err)
	}
	log.Info(fmt.Sprintf("demo: B enqueued the webhook to %s/hooks/report-published with epoch %d: intent %d", d.echo.URL(), m, hres.IntentID),
		"worker", "B", "intent_id", hres.IntentID, "operation_id", hookOp)

	// 5. The dispatcher relays them through NATS; the adapters execute and
	// record the outcome in PostgreSQL.
	frec, err := demoAwait(ctx, ob, log, fres.IntentID)
	if err != nil {
		return err
	}
	for _, id := range []int64{mres.IntentID, hres.IntentID} {
		if _, err := demoAwait(ctx, ob, log, id); err != nil {
			return err
		}
	}
	if frec.Status == outbox.StatusSuperseded {
		log.Warn(fmt.Sprintf("demo: B's publication was superseded at the destination: %s already holds a newer epoch from an earlier run "+
			"against another database (epochs restarted with a fresh database); use an empty --file-root", demoTarget), "result", string(frec.Result))
	}

	// 6. A wakes up, still believing it holds the lease, and writes.
	if wait := demoPause - time.Since(pausedAt); wait > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	log.Info(fmt.Sprintf("demo: A wakes up after %s and writes its report with epoch %d, still believing it holds the lease",
		time.Since(pausedAt).Round(100*time.Millisecond), n), "worker", "A")
	aOp := demoOpID("A", "report", n)
	aPayload := demoJSON(map[string]any{"target": demoTarget, "content": fmt.Sprintf("report by A, epoch %d", n)})
	_, err = ob.Enqueue(ctx, outbox.Intent{Resource: demoResource, Epoch: n, OperationID: aOp, Kind: file.Kind, Payload: aPayload})
	var stale *outbox.StaleEpochError
	switch {
	case errors.As(err, &stale):
		log.Info(fmt.Sprintf("demo: A's write with epoch %d was rejected: current epoch is %d (StaleEpochError; nothing was stored)",
			stale.Supplied, stale.Current), "worker", "A", "operation_id", aOp)
	case err != nil:
		return fmt.Errorf("A's stale write: %w", err)
	default:
		return fmt.Errorf("A's stale write with epoch %d was accepted: the fence failed", n)
	}

	// 7. The destination's own fence: A's publication, committed with epoch
	// n before the pause, finally arrives — after B's epoch m was published.
	// It goes through the real relay and the file adapter, which compares
	// epochs under its lock at the destination and refuses it; the outcome
	// (superseded) is recorded on the intent, for the pages to show.
	if err := intents.In(pgschema.MustParse(d.opts.Schema)).Unpark(ctx, d.pool, aLateID); err != nil {
		return fmt.Errorf("release A's delayed publication: %w", err)
	}
	_, _ = d.pool.Exec(ctx, `SELECT pg_notify($1, '')`, pgschema.MustParse(d.opts.Schema).IntentsChannel())
	lrec, err := demoAwait(ctx, ob, log, aLateID)
	if err != nil {
		return err
	}
	switch {
	case frec.Status == outbox.StatusSucceeded && lrec.Status == outbox.StatusSuperseded:
		log.Info(fmt.Sprintf("demo: A's delayed publication with epoch %d arrived late and was refused at the file destination: superseded, %s holds epoch %d",
			n, demoTarget, m), "worker", "A", "intent_id", aLateID, "result", string(lrec.Result))
	case frec.Status == outbox.StatusSucceeded:
		return fmt.Errorf("the file destination did not refuse A's stale publication: %s", lrec.Status)
	}

	// 8. What is published.
	if b, err := os.ReadFile(filepath.Join(d.fileRoot, filepath.FromSlash(demoTarget))); err == nil {
		log.Info(fmt.Sprintf("demo: %s contains %q", filepath.Join(d.fileRoot, filepath.FromSlash(demoTarget)), string(b)))
	}
	if d.sink != nil {
		log.Info(fmt.Sprintf("demo: the SMTP sink holds %d message(s)", len(d.sink.Messages())))
	}
	log.Info(fmt.Sprintf("demo: the webhook receiver got %d request(s) for the report's key (%s/requests)",
		d.echo.Count(hookKey), d.echo.URL()))
	if err := issuer.Release(ctx, demoResource, demoHolderB, m); err != nil {
		log.Warn("demo: B could not release the lease", "error", err)
	}
	log.Info(fmt.Sprintf("demo: done. B's report (epoch %d) is published, mailed and announced once; A's stale write (epoch %d) changed nothing. Browse %s; Ctrl-C to stop.",
		m, n, d.adminURL))
	return nil
}

// demoEnqueueParked enqueues in and, in the same transaction, parks it under
// a long claim of a dispatcher that does not exist, so no dispatcher relays
// it until the demo clears the claim.
func (d *devEnv) demoEnqueueParked(ctx context.Context, ob *outbox.Client, in outbox.Intent) (int64, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	res, err := ob.EnqueueTx(ctx, tx, in)
	if err != nil {
		return 0, err
	}
	if err := intents.In(pgschema.MustParse(d.opts.Schema)).Park(ctx, tx, res.IntentID, "demo: in transit", time.Hour); err != nil {
		return 0, err
	}
	return res.IntentID, tx.Commit(ctx)
}

// demoAcquire takes the demo resource's lease for holder, waiting while
// another holder's lease is live (as a worker polling for a job would).
func demoAcquire(ctx context.Context, issuer *lease.Issuer, log *slog.Logger, holder string) (lease.Lease, error) {
	logged := false
	for {
		l, err := issuer.Acquire(ctx, demoResource, holder, demoTTL)
		var held *lease.HeldError
		if !errors.As(err, &held) {
			if err != nil {
				return lease.Lease{}, fmt.Errorf("%s acquires the lease: %w", holder, err)
			}
			return l, nil
		}
		if !logged {
			log.Info(fmt.Sprintf("demo: %s asks for the lease: held by %s (epoch %d) until %s; waiting",
				holder, held.Holder, held.Epoch, held.ExpiresAt.Format("15:04:05.000")))
			logged = true
		}
		select {
		case <-ctx.Done():
			return lease.Lease{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// demoAwait polls an intent until it is terminal, logging each status.
func demoAwait(ctx context.Context, ob *outbox.Client, log *slog.Logger, id int64) (*outbox.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	var last outbox.Status
	for {
		rec, err := ob.Get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("intent %d: %w", id, err)
		}
		if rec.Status != last {
			last = rec.Status
			attrs := []any{"intent_id", id, "kind", rec.Kind, "status", rec.Status}
			if rec.Status.Terminal() {
				attrs = append(attrs, "result", string(rec.Result))
			}
			if rec.LastError != nil {
				attrs = append(attrs, "last_error", *rec.LastError)
			}
			log.Info(fmt.Sprintf("demo: intent %d (%s, epoch %d) is %s", id, rec.Kind, rec.Epoch, rec.Status), attrs...)
		}
		if rec.Status.Terminal() {
			return rec, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("intent %d still %s after %s", id, rec.Status, demoWait)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func demoJSON(v map[string]any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of strings always encode
	}
	return b
}
