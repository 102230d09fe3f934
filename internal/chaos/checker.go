package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/internal/smtptest"
)

// InstallLogs adds the test-only commit-order logs to a chaos database:
// grant_log gets a row in the transaction of every change of a resource's
// epoch, intent_log one in the transaction that inserted an intent (the
// intents row itself is updated later, so its xmin is not the inserting
// transaction's). With track_commit_timestamp on, their xmin commit
// timestamps order grants and intent commits.
func InstallLogs(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
		CREATE TABLE chaos_grant_log (resource_id text NOT NULL, epoch bigint NOT NULL);
		CREATE FUNCTION chaos_log_grant() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.epoch > 0 AND (TG_OP = 'INSERT' OR NEW.epoch <> OLD.epoch) THEN
				INSERT INTO chaos_grant_log VALUES (NEW.resource_id, NEW.epoch);
			END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER chaos_log_grant AFTER INSERT OR UPDATE ON resources FOR EACH ROW EXECUTE FUNCTION chaos_log_grant();
		CREATE TABLE chaos_intent_log (intent_id bigint NOT NULL, resource_id text NOT NULL, epoch bigint NOT NULL, operation_id text NOT NULL);
		CREATE FUNCTION chaos_log_intent() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO chaos_intent_log VALUES (NEW.intent_id, NEW.resource_id, NEW.epoch, NEW.operation_id);
			RETURN NULL;
		END $$;
		CREATE TRIGGER chaos_log_intent AFTER INSERT ON intents FOR EACH ROW EXECUTE FUNCTION chaos_log_intent();`)
	return err
}

// Env is what the checker reads besides the history.
type Env struct {
	Pool       *pgxpool.Pool
	MailpitURL string
	MailDomain string
	FileRoot   string
}

// Report is the checker's verdict.
type Report struct {
	Violations []string
	// Evidence holds, per violation, the offending part of the history.
	Evidence []string
	// Stats counts what was checked.
	Stats map[string]int
}

func (r *Report) add(v string, evidence ...string) {
	r.Violations = append(r.Violations, v)
	r.Evidence = append(r.Evidence, strings.Join(evidence, "\n"))
}

type intentRow struct {
	id       int64
	res      string
	epoch    int64
	opID     string
	kind     string
	key      string
	payload  string
	status   string
	result   []byte
	commitTS time.Time
}

// Check verifies I1–I6 and the register's linearizability after the run
// has drained.
func Check(ctx context.Context, env Env, ops []Op) (*Report, error) {
	r := &Report{Stats: map[string]int{}}
	intents, err := loadIntents(ctx, env.Pool)
	if err != nil {
		return nil, err
	}
	byOp := map[string]intentRow{}
	for _, in := range intents {
		byOp[in.res+"\x00"+in.opID] = in
	}
	r.Stats["intents"] = len(intents)
	r.Stats["operations"] = len(ops)
	for _, o := range ops {
		r.Stats[o.Kind+"/"+o.Result]++
	}

	// I1: commit order.
	if err := checkCommitOrder(ctx, env.Pool, r); err != nil {
		return nil, err
	}

	// I4: every committed intent is terminal; every acknowledged enqueue
	// is in the outbox, as acknowledged.
	for _, in := range intents {
		if in.status == "pending" || in.status == "relayed" {
			r.add(fmt.Sprintf("I4: intent %d (%s/%s) is still %s after the drain", in.id, in.res, in.opID, in.status))
		}
		r.Stats["status/"+in.status]++
	}
	for _, o := range ops {
		if o.Kind != "enqueue" || o.Result != "ok" {
			continue
		}
		in, ok := byOp[o.Resource+"\x00"+o.OpID]
		if !ok || in.id != o.IntentID {
			r.add(fmt.Sprintf("I4: acknowledged enqueue %s/%s (intent %d) is not in the outbox", o.Resource, o.OpID, o.IntentID), o.String())
		} else if !o.Duplicate && in.epoch != o.Epoch {
			r.add(fmt.Sprintf("I4: enqueue %s/%s acknowledged at epoch %d, stored at %d", o.Resource, o.OpID, o.Epoch, in.epoch), o.String())
		}
	}

	// I6: an operation id reused with different content is never stored
	// and never executed.
	for _, o := range ops {
		if o.Kind != "enqueue" || !o.Reuse {
			continue
		}
		r.Stats["reuse_attempts"]++
		if o.Result == "ok" {
			r.add(fmt.Sprintf("I6: reuse of operation id %s/%s with different content was accepted", o.Resource, o.OpID), o.String())
		}
		if in, ok := byOp[o.Resource+"\x00"+o.OpID]; ok && jsonEq(in.payload, o.Payload) {
			r.add(fmt.Sprintf("I6: intent %d stores the refused content of a reused operation id", in.id), o.String())
		}
	}
	for _, in := range intents {
		if strings.Contains(in.payload, "CONFLICT") {
			r.add(fmt.Sprintf("I6: intent %d carries refused content", in.id))
		}
	}

	// Email: I3 (at most one message per business key) and I5 (no message
	// without a committed intent of its key).
	keys := map[string]bool{}
	committedKeys := map[string][]intentRow{}
	for _, o := range ops {
		if o.Kind == "enqueue" && o.IntentKnd == "email" {
			keys[o.Key] = true
		}
	}
	for _, in := range intents {
		if in.kind == "email" {
			committedKeys[in.key] = append(committedKeys[in.key], in)
		}
	}
	sortedKeys := make([]string, 0, len(keys))
	for k := range keys {
		sortedKeys = append(sortedKeys, k)
	}
	sort.Strings(sortedKeys)
	for _, k := range sortedKeys {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		n, err := smtptest.CountMessageID(c, env.MailpitURL, email.MessageID(k, env.MailDomain))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("mailpit: %w", err)
		}
		r.Stats["email_messages"] += n
		succeeded := false
		for _, in := range committedKeys[k] {
			succeeded = succeeded || in.status == "succeeded"
		}
		switch {
		case n > 1:
			r.add(fmt.Sprintf("I3: %d messages with the Message-ID of business key %q, want at most 1", n, k), describeIntents(committedKeys[k]))
		case n == 1 && len(committedKeys[k]) == 0:
			r.add(fmt.Sprintf("I5: a message for business key %q, but no committed intent has that key", k))
		case n == 0 && succeeded:
			r.add(fmt.Sprintf("I5/lookup: an intent of key %q succeeded but Mailpit holds no message", k), describeIntents(committedKeys[k]))
		}
	}

	// Files: I2, I3, I5, I6 from the destination's manifest.
	if err := checkFiles(env, intents, r); err != nil {
		return nil, err
	}

	// The lease/epoch register's history is linearizable.
	bad, conclusive := Linearizable(ops, 60)
	if !conclusive {
		r.Stats["linearizability_inconclusive"] = 1
	}
	for res, hist := range bad {
		lines := make([]string, 0, len(hist))
		for _, o := range hist {
			lines = append(lines, o.String())
		}
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		r.add(fmt.Sprintf("linearizability: the lease/epoch history of %s is not linearizable", res), lines...)
	}
	return r, nil
}

func describeIntents(ins []intentRow) string {
	var b strings.Builder
	for _, in := range ins {
		fmt.Fprintf(&b, "intent %d %s/%s epoch %d key %s status %s result %s\n", in.id, in.res, in.opID, in.epoch, in.key, in.status, in.result)
	}
	return b.String()
}

func jsonEq(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return a == b
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

func loadIntents(ctx context.Context, pool *pgxpool.Pool) ([]intentRow, error) {
	rows, err := pool.Query(ctx, `
		SELECT i.intent_id, i.resource_id, i.epoch, i.operation_id, i.kind, i.idempotency_key, i.payload::text,
		       i.status, coalesce(i.result::text, 'null'), pg_xact_commit_timestamp(l.xmin)
		FROM intents i JOIN chaos_intent_log l USING (intent_id) ORDER BY i.intent_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []intentRow
	for rows.Next() {
		var in intentRow
		var res string
		if err := rows.Scan(&in.id, &in.res, &in.epoch, &in.opID, &in.kind, &in.key, &in.payload, &in.status, &res, &in.commitTS); err != nil {
			return nil, err
		}
		in.result = []byte(res)
		out = append(out, in)
	}
	return out, rows.Err()
}

// checkCommitOrder verifies I1: ordered by commit timestamp, every intent
// carries the highest epoch granted on its resource before it committed.
func checkCommitOrder(ctx context.Context, pool *pgxpool.Pool, r *Report) error {
	type ev struct {
		res   string
		epoch int64
		ts    time.Time
		grant bool
		what  string
	}
	var evs []ev
	load := func(q string, grant bool) error {
		rows, err := pool.Query(ctx, q)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			e := ev{grant: grant}
			if err := rows.Scan(&e.res, &e.epoch, &e.ts, &e.what); err != nil {
				return err
			}
			evs = append(evs, e)
		}
		return rows.Err()
	}
	if err := load(`SELECT resource_id, epoch, pg_xact_commit_timestamp(xmin), 'grant' FROM chaos_grant_log`, true); err != nil {
		return err
	}
	if err := load(`SELECT resource_id, epoch, pg_xact_commit_timestamp(xmin), 'intent ' || intent_id || ' op ' || operation_id FROM chaos_intent_log`, false); err != nil {
		return err
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].ts.Before(evs[j].ts) })
	current := map[string]int64{}
	for i, e := range evs {
		if e.grant {
			if e.epoch < current[e.res] {
				r.add(fmt.Sprintf("I1: epoch of %s went back from %d to %d", e.res, current[e.res], e.epoch))
			}
			current[e.res] = max(current[e.res], e.epoch)
			r.Stats["grants"]++
			continue
		}
		tie := (i > 0 && evs[i-1].ts.Equal(e.ts)) || (i+1 < len(evs) && evs[i+1].ts.Equal(e.ts))
		if !tie && e.epoch != current[e.res] {
			var ctxLines []string
			for j := max(0, i-5); j < min(len(evs), i+3); j++ {
				ctxLines = append(ctxLines, fmt.Sprintf("%s %s epoch %d %s", evs[j].ts.Format(time.RFC3339Nano), evs[j].res, evs[j].epoch, evs[j].what))
			}
			r.add(fmt.Sprintf("I1: %s on %s committed with epoch %d while the current epoch was %d", e.what, e.res, e.epoch, current[e.res]), ctxLines...)
		}
	}
	return nil
}

func checkFiles(env Env, intents []intentRow, r *Report) error {
	a, err := file.New(file.Config{Root: env.FileRoot})
	if err != nil {
		return err
	}
	byID := map[int64]intentRow{}
	targets := map[string][]intentRow{}
	for _, in := range intents {
		byID[in.id] = in
		if in.kind != "file" {
			continue
		}
		var p struct{ Target string }
		_ = json.Unmarshal([]byte(in.payload), &p)
		targets[p.Target] = append(targets[p.Target], in)
	}
	names := make([]string, 0, len(targets))
	for t := range targets {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, target := range names {
		ins := targets[target]
		m, ok, err := a.Published(target)
		if err != nil {
			return fmt.Errorf("manifest of %s: %w", target, err)
		}
		var maxSucceeded int64
		for _, in := range ins {
			if in.status == "succeeded" {
				maxSucceeded = max(maxSucceeded, in.epoch)
			}
		}
		if !ok {
			if maxSucceeded > 0 {
				r.add(fmt.Sprintf("I2: %s has succeeded publications but no manifest", target))
			}
			continue
		}
		pubs := append(append([]file.Publication{}, m.History...), m.Publication)
		r.Stats["file_publications"] += len(pubs)
		seen := map[string]int{}
		var prev int64
		for i, p := range pubs {
			if p.Epoch < prev {
				r.add(fmt.Sprintf("I2: %s: publication %d (intent %d) has epoch %d after epoch %d", target, i, p.IntentID, p.Epoch, prev), describeIntents(ins))
			}
			prev = max(prev, p.Epoch)
			seen[p.IdempotencyKey]++
			in, ok := byID[p.IntentID]
			if !ok || in.key != p.IdempotencyKey || in.epoch != p.Epoch {
				r.add(fmt.Sprintf("I5: %s: publication of intent %d (key %s, epoch %d) has no matching committed intent", target, p.IntentID, p.IdempotencyKey, p.Epoch))
			}
		}
		for k, n := range seen {
			if n > 1 {
				r.add(fmt.Sprintf("I3: %s: business key %s published %d times", target, k, n))
			}
		}
		content, err := os.ReadFile(filepath.Join(env.FileRoot, target))
		if err != nil {
			return err
		}
		sum := sha256.Sum256(content)
		if hex.EncodeToString(sum[:]) != m.SHA256 {
			r.add(fmt.Sprintf("I2: %s: content is not the current publication's (intent %d)", target, m.IntentID))
		}
		if m.Epoch != prev || (maxSucceeded > 0 && m.Epoch < maxSucceeded) {
			r.add(fmt.Sprintf("I2: %s: final content from epoch %d, but epoch %d published (succeeded up to %d)", target, m.Epoch, prev, maxSucceeded))
		}
		if strings.Contains(string(content), "CONFLICT") {
			r.add(fmt.Sprintf("I6: %s holds refused content", target))
		}
	}
	return nil
}
