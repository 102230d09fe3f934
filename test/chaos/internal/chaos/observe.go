package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/testkit/smtptest"
)

// Env is where the checker reads what the run left behind.
type Env struct {
	Pool *pgxpool.Pool
	// Schema is fencegate's schema (empty: the default).
	Schema     string
	MailpitURL string
	MailDomain string
	FileRoot   string
	// EmailOnce says the run's email mode promises at most one message per
	// business key (a result lookup, or a destination that dedups).
	EmailOnce bool
	// Crashes are the CLOCK_MONOTONIC times (Mono) of PostgreSQL kill -9s,
	// for the evidence of a lost acknowledgement.
	Crashes []int64
	// LateStores counts, per Message-ID, the messages the destination
	// stored after the sender's reply deadline (a late-accepting SMTP
	// front), for the evidence of a duplicate.
	LateStores map[string]int
	// MailByIntent counts, per intent id, the messages the email
	// destination stored that the intent's attempts sent (SMTPFront).
	MailByIntent map[int64]int
	// Hooks are the webhook requests the receiver acted on; HookDedups
	// says whether the receiver is listed as deduplicating on the key.
	Hooks      []Delivery
	HookDedups bool
	// Min is what the run must have exercised (Verify's V).
	Min Minimum
	// Faults counts the faults the nemesis scheduled, per kind; Injected
	// those a destination actually applied (a fault that needs no
	// destination's cooperation counts as injected when scheduled).
	Faults, Injected map[string]int
}

// Minimum is what a run must have exercised for its verdict to mean
// anything: a run that enqueued nothing, or whose destinations saw no
// effect, or whose scheduled faults never hit, passes every check
// vacuously.
type Minimum struct {
	// Enqueues: acknowledged enqueues (first inserts, not duplicates).
	Enqueues int
	// Effects at each destination kind: email messages stored, webhook
	// requests acted on, file publications.
	Effects int
}

// Intent is an intents row as the checker sees it.
type Intent struct {
	ID        int64
	Resource  string
	Epoch     int64
	OpID      string
	Kind      string
	Key       string
	Payload   string
	Status    string
	Result    string
	LastError string
	// Effect is the intents row's effect column (none, possible, done)
	// where the schema has it; empty otherwise.
	Effect    string
	Committed time.Time // commit timestamp of the inserting transaction
}

// Grant is a chaos_grant_log row: a change of a resource's epoch.
type Grant struct {
	Resource  string
	Epoch     int64
	Holder    string
	Committed time.Time
}

// Target is a file target at the destination.
type Target struct {
	// Manifest is the destination's record; Exists is false without one.
	Manifest file.Manifest
	Exists   bool
	// ContentMatches reports whether the file's sha256 is the last
	// applied publication's (applied).
	ContentMatches bool
	// Refused reports whether the file holds refused (reused operation id)
	// content.
	Refused bool
	// Truncated reports whether the manifest's history is full, so older
	// publications may have dropped out of it.
	Truncated bool
}

// Observed is the state the run left behind: the database, the email
// destination and the file root.
type Observed struct {
	Intents []Intent
	Grants  []Grant
	// Epochs is each resource's final epoch.
	Epochs map[string]int64
	// MailCopies counts, per email business key, the messages with its
	// Message-ID at the destination.
	MailCopies map[string]int
	// Files maps each file target named by an intent to what is there.
	Files map[string]Target
	// EmailOnce, Crashes and LateStores are copied from Env.
	EmailOnce  bool
	Crashes    []int64
	LateStores map[string]int
	// MailDomain makes Message-IDs for the evidence.
	MailDomain string
	// MailByIntent, Hooks, HookDedups, Min, Faults and Injected are copied
	// from Env.
	MailByIntent     map[int64]int
	Hooks            []Delivery
	HookDedups       bool
	Min              Minimum
	Faults, Injected map[string]int
}

// Observe reads the state the run left behind. The email business keys
// counted at Mailpit are those of the history and of the outbox.
func Observe(ctx context.Context, env Env, ops []Op) (*Observed, error) {
	obs := &Observed{Epochs: map[string]int64{}, MailCopies: map[string]int{}, Files: map[string]Target{},
		EmailOnce: env.EmailOnce, Crashes: env.Crashes, LateStores: env.LateStores, MailDomain: env.MailDomain,
		MailByIntent: env.MailByIntent, Hooks: env.Hooks, HookDedups: env.HookDedups, Min: env.Min, Faults: env.Faults, Injected: env.Injected}
	schema, err := pgschema.Parse(env.Schema)
	if err != nil {
		return nil, err
	}
	if obs.Intents, err = loadIntents(ctx, env.Pool, schema); err != nil {
		return nil, err
	}
	if obs.Grants, err = loadGrants(ctx, env.Pool); err != nil {
		return nil, err
	}
	rows, err := env.Pool.Query(ctx, schema.SQL(`SELECT resource_id, epoch FROM fencegate.resources`))
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var res string
		var e int64
		if err := rows.Scan(&res, &e); err != nil {
			rows.Close()
			return nil, err
		}
		obs.Epochs[res] = e
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	keys := map[string]bool{}
	for _, o := range ops {
		if o.Kind == "enqueue" && o.IntentKnd == "email" {
			keys[o.Key] = true
		}
	}
	for _, in := range obs.Intents {
		if in.Kind == "email" {
			keys[in.Key] = true
		}
	}
	for _, k := range sortedKeys(keys) {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		n, err := smtptest.CountMessageID(c, env.MailpitURL, email.MessageID(k, env.MailDomain))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("mailpit: %w", err)
		}
		obs.MailCopies[k] = n
	}

	a, err := file.New(file.Config{Root: env.FileRoot})
	if err != nil {
		return nil, err
	}
	for _, in := range obs.Intents {
		target := fileTarget(in)
		if in.Kind != "file" || target == "" {
			continue
		}
		if _, done := obs.Files[target]; done {
			continue
		}
		m, ok, err := a.Published(target)
		if err != nil {
			return nil, fmt.Errorf("manifest of %s: %w", target, err)
		}
		t := Target{Manifest: m, Exists: ok, Truncated: len(m.History) >= file.DefaultHistoryLimit}
		if ok {
			// The file holds the last applied publication's content
			// (applied: not a pending one, whose rename never came), or
			// is absent when none was ever applied.
			pubs := applied(m)
			content, err := os.ReadFile(filepath.Join(env.FileRoot, target))
			switch {
			case errors.Is(err, fs.ErrNotExist) && len(pubs) == 0:
				t.ContentMatches = true
			case err != nil:
				return nil, err
			case len(pubs) > 0:
				sum := sha256.Sum256(content)
				t.ContentMatches = hex.EncodeToString(sum[:]) == pubs[len(pubs)-1].SHA256
			}
			t.Refused = strings.Contains(string(content), "CONFLICT")
		}
		obs.Files[target] = t
	}
	return obs, nil
}

func fileTarget(in Intent) string {
	var p struct{ Target string }
	_ = json.Unmarshal([]byte(in.Payload), &p)
	return p.Target
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func loadIntents(ctx context.Context, pool *pgxpool.Pool, schema pgschema.Schema) ([]Intent, error) {
	// The effect column where the schema has it (to_jsonb: no error
	// where it has not).
	rows, err := pool.Query(ctx, schema.SQL(`
		SELECT i.intent_id, i.resource_id, i.epoch, i.operation_id, i.kind, i.idempotency_key, i.payload::text,
		       i.status, coalesce(i.result::text, 'null'), coalesce(i.last_error, ''), coalesce(to_jsonb(i)->>'effect', ''),
		       pg_xact_commit_timestamp(l.xmin)
		FROM fencegate.intents i JOIN chaos.intent_log l USING (intent_id) ORDER BY i.intent_id`))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Intent
	for rows.Next() {
		var in Intent
		if err := rows.Scan(&in.ID, &in.Resource, &in.Epoch, &in.OpID, &in.Kind, &in.Key, &in.Payload, &in.Status, &in.Result, &in.LastError, &in.Effect, &in.Committed); err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, rows.Err()
}

func loadGrants(ctx context.Context, pool *pgxpool.Pool) ([]Grant, error) {
	rows, err := pool.Query(ctx, `SELECT resource_id, epoch, coalesce(holder, ''), pg_xact_commit_timestamp(xmin) FROM chaos.grant_log`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Grant
	for rows.Next() {
		var g Grant
		if err := rows.Scan(&g.Resource, &g.Epoch, &g.Holder, &g.Committed); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, rows.Err()
}
