package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fencegate/fencegate/internal/failpoint"
	"github.com/fencegate/fencegate/internal/group"
	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/outbox"
)

// Group commit (Config.GroupCommit): the BeginRecording and CompleteOutcome
// calls of concurrent attempts share durable transactions, so that a
// backlog settles with a few statements and one commit per batch instead
// of per intent.
//
// Nothing a caller sees changes; each call gets the answer it would get
// alone:
//   - Only the common case is decided in the shared transaction, set-based:
//     a Begin whose key is new (Execute), and a Complete (succeeded or
//     failed) by the attempt that owns its key. Everything else — a key that
//     exists (Done, Busy, Conflict, Recover, a resumed wait), a second call
//     for the same key in one batch, a Complete that lost its key or is a
//     retry, unknown or superseded outcomes, an intent that is gone — is
//     sent back to its caller, which runs the single-call path in a
//     transaction of its own after the batch committed: as if the batch had
//     never touched it.
//   - A caller learns "begun" or "completed" only from a batch whose commit
//     returned without error (durable: internal/durable), so an attempt is
//     on disk before its effect starts, and an outcome before its message
//     is acked, exactly as alone.
//   - Lock order: the one of internal/intents' package doc (keys kind by
//     kind, each kind's bytewise, then intents by id), over many rows at
//     once, so batches never deadlock with one another or with the single
//     path. Should PostgreSQL still abort a batch (a
//     deadlock with another writer, any server error: nothing of it
//     committed), every call in it is retried alone.
//   - When the outcome of the shared commit is unknown (the connection
//     broke), every caller gets that error, as a single call would; the
//     callers' retries are the single path's.

// groupTxOptions begin a shared transaction: READ COMMITTED as every
// decision of the store, and plans that reach every row by an index, made
// once per connection.
//
// Every statement of a batch reaches its rows by key (the keys' primary
// key, the intents' ids), so a probe of an index is always the right plan;
// but the planner, on statistics older than the table (a new install, a
// burst: autovacuum analyzes a minute later at best), chose sequential,
// bitmap and hash-join scans that grew with the table — 5 ms a batch and
// rising through a drain of 50,000 intents (docs/performance.md). A
// custom plan for every batch follows the table's size but costs ~0.8 ms
// of planning a batch, which at a steady 500 /s, where batches hold one or
// two intents, was most of PostgreSQL's extra work per intent over a
// drain. With scans that are not index probes ruled out (enable_seqscan,
// enable_bitmapscan, enable_hashjoin, enable_mergejoin off: only where no
// index path exists does the planner still choose one), the generic plan
// is a probe whatever the statistics say, and force_generic_plan keeps it
// for the connection's next batches. TestGroupPlansProbeAndAreKept checks
// both on a young table.
var groupTxOptions = pgx.TxOptions{
	IsoLevel:   pgx.ReadCommitted,
	BeginQuery: "BEGIN ISOLATION LEVEL READ COMMITTED; " + intents.ProbePlans,
}

// beginKeysSQL creates the keys of a shared Begin that are new ($1 kinds,
// $2 keys, $3 fingerprints, $4 intent ids, $7 begin nonces, in the lock
// order; $5 the lock timeout) and counts the attempts of their intents
// that have no final status ($6); beginBatch says how.
const beginKeysSQL = `
WITH ins AS (
	INSERT INTO fencegate.idempotency_keys
		(kind, idempotency_key, fingerprint, state, owner_intent_id, first_intent_id, locked_until, begin_nonce)
	SELECT t.kind, t.key, t.fp, 'started', t.id, t.id, clock_timestamp() + $5::interval, nullif(t.nonce, 0)
	FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $7::bigint[]) WITH ORDINALITY AS t(kind, key, fp, id, nonce, ord)
	ORDER BY t.ord
	ON CONFLICT (kind, idempotency_key) DO NOTHING
	RETURNING owner_intent_id, token, locked_until
), ` + intents.CountAttemptsCTE + `
SELECT ins.owner_intent_id, ins.token, ins.locked_until, upd.attempts, upd.effect
FROM ins LEFT JOIN upd ON upd.intent_id = ins.owner_intent_id`

// lockKeysSQL locks the keys ($1 kinds, $2 keys, in lock order) of a
// shared Complete, each by its own probe of the primary key (completeBatch
// says why), and returns each key's kind, key, ctid, state, token and
// owner.
const lockKeysSQL = `
SELECT t.kind, t.key, k.tid, k.state, k.token, k.owner_intent_id
FROM unnest($1::text[], $2::text[]) AS t(kind, key)
CROSS JOIN LATERAL (
	SELECT ctid AS tid, state, token, owner_intent_id
	FROM fencegate.idempotency_keys
	WHERE kind = t.kind AND idempotency_key = t.key
	FOR UPDATE) k`

// completeKeysSQL records the outcomes of a shared Complete's keys where
// lockKeysSQL locked them ($1 ctids, then kinds, keys, statuses, results
// and errors).
const completeKeysSQL = `
UPDATE fencegate.idempotency_keys k
SET state = 'completed', status = t.status, locked_until = NULL,
    result = t.result::jsonb, last_error = t.err, completed_at = now(), updated_at = now()
FROM unnest($1::tid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS t(tid, kind, key, status, result, err)
WHERE k.ctid = t.tid AND k.kind = t.kind AND k.idempotency_key = t.key`

// errAlone sends a call back to its caller, to be run alone.
var errAlone = errors.New("idempotency: not decided in the batch; run alone")

type beginCall struct {
	kind, key, fingerprint string
	intentID               int64
	nonce                  int64 // BeginOptions.Nonce
}

type keyID struct{ kind, key string }

// byKey returns the indexes of items ordered by (kind, key) bytewise — the
// lock order of every batch — and marks the second and later calls of one
// key (answered alone).
func byKey[T any](items []T, key func(T) keyID) (order []int, dup []bool) {
	order = make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ka, kb := key(items[a]), key(items[b])
		if c := bytes.Compare([]byte(ka.kind), []byte(kb.kind)); c != 0 {
			return c
		}
		return bytes.Compare([]byte(ka.key), []byte(kb.key))
	})
	dup = make([]bool, len(items))
	for j := 1; j < len(order); j++ {
		if key(items[order[j]]) == key(items[order[j-1]]) {
			dup[order[j]] = true
		}
	}
	return order, dup
}

// noteBatchFailed counts and logs a shared transaction that failed, at
// batchFailureLevel.
func (s *Store) noteBatchFailed(err error, what string) {
	s.groupFailures.Add(1)
	s.failures.WithLabelValues(what).Inc()
	s.cfg.Logger.Log(context.Background(), batchFailureLevel(err), "idempotency: a shared transaction failed; its calls run alone", "what", what, "error", err)
}

// batchFailureLevel: a shared transaction the server refused (a deadlock,
// a constraint) is a warning. One that PostgreSQL being away failed is at
// debug: every batch fails then, one for each call at each of its
// retries, and the callers say it once (the runtime's "recording
// failed"). Away is no server answer at all, or one of SQLSTATE class 08
// (connection exception) or 57 (the server shutting down or starting up:
// 57P01, 57P03 "the database system is starting up", which a connection
// made while it restarts gets).
func batchFailureLevel(err error) slog.Level {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57") {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// GroupFailures returns how many shared transactions (group commit) have
// failed since the store was made — a deadlock with another writer, any
// server error — each call of which then ran alone. Zero is the normal.
func (s *Store) GroupFailures() int64 { return s.groupFailures.Load() }

// failBatch answers every call of a batch whose transaction failed.
func failBatch[T any](out []group.Result[T], err error, what string) {
	var pgErr *pgconn.PgError
	alone := errors.As(err, &pgErr) // rejected by the server: nothing committed
	for i := range out {
		if alone {
			out[i].Err = errAlone
		} else {
			out[i].Err = fmt.Errorf("idempotency: %s (group commit): %w", what, err)
		}
	}
}

func (s *Store) beginBatch(ctx context.Context, calls []beginCall) []group.Result[Decision] {
	out := make([]group.Result[Decision], len(calls))
	order, dup := byKey(calls, func(c beginCall) keyID { return keyID{c.kind, c.key} })
	var kinds, keys, fps []string
	var ids, nonces []int64
	byIntent := map[int64]int{}
	for _, i := range order {
		if dup[i] {
			out[i].Err = errAlone
			continue
		}
		c := calls[i]
		if _, seen := byIntent[c.intentID]; seen {
			// The same intent under two keys cannot happen (an intent has
			// one key); answered alone if it does.
			out[i].Err = errAlone
			continue
		}
		byIntent[c.intentID] = i
		kinds, keys, fps, ids = append(kinds, c.kind), append(keys, c.key), append(fps, c.fingerprint), append(ids, c.intentID)
		nonces = append(nonces, c.nonce)
	}
	s.batchSize.WithLabelValues("begin").Observe(float64(len(kinds)))
	decided := map[int]bool{}
	err := s.inTxWith(ctx, groupTxOptions, func(tx pgx.Tx) error {
		clear(decided)
		// One statement, one round trip:
		// 1. ins: create the keys that are new, in the lock order (the
		//    rows come in ordinality order, sorted above). As in Begin, the
		//    primary key is the arbiter: of concurrent Begins of a new key
		//    exactly one inserts. A key that exists is answered alone.
		// 2. l, upd (internal/intents.CountAttemptsCTE): count the
		//    attempts, in the same transaction as the keys, only on intents
		//    without a final status, every key taken before any intent.
		rows, err := tx.Query(ctx, s.schema.SQL(beginKeysSQL),
			kinds, keys, fps, ids, interval(s.cfg.LockTimeout), terminalStatuses, nonces)
		if err != nil {
			return fmt.Errorf("begin keys: %w", err)
		}
		inserted := map[int64]Decision{}
		counted := map[int64]int{}
		var newIDs []int64
		for rows.Next() {
			var id int64
			var d Decision
			var n *int
			var effect *string
			if err := rows.Scan(&id, &d.Token, &d.LockedUntil, &n, &effect); err != nil {
				rows.Close()
				return err
			}
			d.Outcome, d.OwnerIntentID = OutcomeExecute, id
			if effect != nil {
				d.Effect = outbox.Effect(*effect)
			}
			inserted[id] = d
			newIDs = append(newIDs, id)
			if n != nil {
				counted[id] = *n
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("begin keys: %w", err)
		}
		for _, id := range newIDs {
			i := byIntent[id]
			decided[i] = true
			d := inserted[id]
			if n, ok := counted[id]; ok {
				d.Attempts, d.CountedAt = n, time.Now()
				out[i] = group.Result[Decision]{Value: d}
				continue
			}
			// The intent has a final status (or is gone), or its next
			// attempt is deferred (intents.NotDeferred): alone, Begin
			// would roll back and create no key. Undo this key, in this
			// transaction, and answer what Begin answers.
			c := calls[i]
			if _, err := tx.Exec(ctx, s.schema.SQL(`DELETE FROM fencegate.idempotency_keys WHERE kind = $1 AND idempotency_key = $2 AND token = $3`),
				c.kind, c.key, d.Token); err != nil {
				return fmt.Errorf("undo key: %w", err)
			}
			var ie *IntentTerminalError
			var de *DeferredError
			switch err := s.notCounted(ctx, tx, id); {
			case errors.As(err, &de):
				out[i] = group.Result[Decision]{Value: Decision{Outcome: OutcomeBusy, OwnerIntentID: id, RetryAfter: de.Remaining}}
			case errors.As(err, &ie), errors.Is(err, ErrIntentNotFound):
				out[i] = group.Result[Decision]{Err: err}
			default:
				return err
			}
		}
		if len(newIDs) > 1 {
			failpoint.Inject(failpoint.InsideGroupBegin) // no-op unless built with -tags failpoints
		}
		return nil
	})
	if err != nil {
		s.noteBatchFailed(err, "begin")
		failBatch(out, err, "begin")
		return out
	}
	for _, i := range byIntent {
		if !decided[i] {
			out[i].Err = errAlone // the key exists: decided alone
		}
	}
	return out
}

func (s *Store) completeBatch(ctx context.Context, calls []Completion) []group.Result[CompleteResult] {
	out := make([]group.Result[CompleteResult], len(calls))
	order, dup := byKey(calls, func(c Completion) keyID { return keyID{c.Kind, c.Key} })
	var kinds, keys []string
	var cand []int
	for _, i := range order {
		c := calls[i]
		// Unknown and superseded outcomes write the key differently, and a
		// proven one the intent's effect; they are rare and go alone.
		if dup[i] || c.Proven || (c.Status != outbox.StatusSucceeded && c.Status != outbox.StatusFailed) {
			out[i].Err = errAlone
			continue
		}
		kinds, keys, cand = append(kinds, c.Kind), append(keys, c.Key), append(cand, i)
	}
	for _, i := range cand {
		out[i].Err = errAlone // until decided in the batch below
	}
	if len(cand) == 0 {
		return out
	}
	s.batchSize.WithLabelValues("complete").Observe(float64(len(cand)))
	decided := map[int]CompleteResult{}
	err := s.inTxWith(ctx, groupTxOptions, func(tx pgx.Tx) error {
		clear(decided)
		// 1. Lock the keys, then the candidates' intents, in one round
		//    trip: the statements are pipelined, and PostgreSQL runs them
		//    one after the other in this order — the lock order of
		//    internal/intents: kind by kind, each kind's keys sorted (byKey
		//    sorts the candidates so, in byte order), then the intents by
		//    id. Each key is locked by its own probe of the primary key (the
		//    LATERAL subquery, its FOR UPDATE inside, runs once per key, in
		//    the array's order, which is the lock order above), so the plan
		//    cannot depend on the table's statistics. "kind = $1 AND key =
		//    ANY($2)" was planned, on statistics older than the table's
		//    growth (a burst on a young table: autovacuum analyzes a
		//    minute later at best), as a scan of every key of the kind,
		//    filtered, whose cost grows with the table (a join to
		//    unnest() was planned as a scan of the table too;
		//    docs/performance.md has the measurements).
		//    The token check and the writes below are one atomic step under
		//    these locks, as in Complete: no Begin can take a key over
		//    between them.
		type keyRow struct {
			tid          pgtype.TID
			state        string
			token, owner int64
		}
		found := map[keyID]keyRow{}
		statuses := map[int64]outbox.Status{}
		ids := make([]int64, 0, len(cand))
		for _, i := range cand {
			ids = append(ids, calls[i].IntentID)
		}
		var b pgx.Batch
		b.Queue(s.schema.SQL(lockKeysSQL), kinds, keys).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var k keyID
				var r keyRow
				if err := rows.Scan(&k.kind, &k.key, &r.tid, &r.state, &r.token, &r.owner); err != nil {
					return err
				}
				found[k] = r
			}
			return rows.Err()
		})
		s.intents.QueueLockStatuses(&b, ids, func(id int64, st string) { statuses[id] = outbox.Status(st) })
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return fmt.Errorf("lock keys and intents: %w", err)
		}
		// 2. Decide. Owned: started, with this attempt's token, by its
		//    intent, and the intent exists. Any other case (lost, a retry
		//    after a lost answer, a wrong intent, an intent gone) is
		//    answered alone, which tells them apart; nothing of it is
		//    written here.
		var kTIDs []pgtype.TID
		var kKinds, kKeys, kStatus []string
		var kResult, kErr []*string
		var iIDs []int64
		var iStatus []string
		var iResult, iErr []*string
		var final []int
		for _, i := range cand {
			c := calls[i]
			r, ok := found[keyID{c.Kind, c.Key}]
			if !ok || State(r.state) != StateStarted || r.token != c.Token || r.owner != c.IntentID {
				continue
			}
			st, ok := statuses[c.IntentID]
			if !ok {
				continue
			}
			res, msg := textOrNil(string(c.Result)), textOrNil(c.Error)
			kTIDs = append(kTIDs, r.tid)
			kKinds, kKeys, kStatus = append(kKinds, c.Kind), append(kKeys, c.Key), append(kStatus, string(c.Status))
			kResult, kErr = append(kResult, res), append(kErr, msg)
			if st.Terminal() {
				final = append(final, i)
				decided[i] = CompleteResult{NotRecorded: true}
				continue
			}
			iIDs, iStatus = append(iIDs, c.IntentID), append(iStatus, string(c.Status))
			iResult, iErr = append(iResult, res), append(iErr, msg)
			decided[i] = CompleteResult{IntentUpdated: true}
		}
		if len(kKinds) == 0 {
			return nil
		}
		// 3. Write the keys' outcomes, and the intents' where they have no
		//    final status, in this one transaction (key and intent never
		//    disagree), pipelined in one round trip.
		//    Each key is written where step 1 found and locked it (its
		//    ctid: a row this transaction has locked cannot move until it
		//    ends), for the same reason as there: a join on the key was
		//    planned as a scan of the kind's keys. The kind and the key are
		//    checked again, and a key not written fails the whole batch
		//    (its calls then run alone): key and intent must not disagree.
		b = pgx.Batch{}
		b.Queue(s.schema.SQL(completeKeysSQL),
			kTIDs, kKinds, kKeys, kStatus, kResult, kErr).Exec(func(ct pgconn.CommandTag) error {
			if n := ct.RowsAffected(); n != int64(len(kKeys)) {
				return fmt.Errorf("wrote %d of %d keys where they were locked", n, len(kKeys))
			}
			return nil
		})
		if len(iIDs) > 0 {
			s.intents.QueueComplete(&b, iIDs, iStatus, iResult, iErr)
		}
		// The attempts' history rows, one statement for the batch.
		var att attemptRows
		for _, i := range cand {
			if _, ok := decided[i]; ok {
				att.add(calls[i].IntentID, calls[i].Attempt)
			}
		}
		if len(att.ids) > 0 {
			b.Queue(s.schema.SQL(attemptsSQL), att.args()...)
		}
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return fmt.Errorf("record outcomes: %w", err)
		}
		// An intent that already had a final status keeps it; the outcome
		// goes into its history, as alone (completeIntent matches no row
		// and records the event).
		for _, i := range final {
			c := calls[i]
			if _, err := s.completeIntent(ctx, tx, c.IntentID, c.Status, c.Result, c.Error, c.Proven); err != nil {
				return err
			}
		}
		if len(kKinds) > 1 {
			failpoint.Inject(failpoint.InsideGroupComplete) // no-op unless built with -tags failpoints
		}
		return nil
	})
	if err != nil {
		s.noteBatchFailed(err, "complete")
		failBatch(out, err, "complete")
		return out
	}
	for i, r := range decided {
		out[i] = group.Result[CompleteResult]{Value: r}
	}
	return out
}

func textOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
