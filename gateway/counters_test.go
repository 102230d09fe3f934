package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// scrapeValue reads series (name{labels} as the text format writes it)
// from the gateway's /metrics; -1 when absent.
func scrapeValue(t *testing.T, g *Gateway, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + g.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v
		}
	}
	return -1
}

// A SQL worker (a role granted only the SQL interface, docs/sql.md) whose
// epoch went stale is refused (ZF002) and its transaction rolls back; the
// refusal still shows in a scrape of the relay's /metrics, as
// fencegate_fence_refusals_total{path="sql",reason="stale_epoch"}, and so
// do its takeover (how after_expiry), a refused renew, and an acquire
// refused while another's lease is live. A refusal of the gateway's own
// outbox is counted by the process (fencegate_stale_epoch_rejections_total)
// and not again here.
func TestSQLWorkerRefusalsInScrape(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ns := natstest.Start(t)
	g, err := Start(context.Background(), Config{Schema: testdb.Schema(), Pool: pool, NATSURL: ns.URL, RunDispatcher: true, MetricsAddr: "127.0.0.1:0",
		Registry: NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	ctx := context.Background()
	stale := `fencegate_fence_refusals_total{path="sql",reason="stale_epoch"}`
	held := `fencegate_fence_refusals_total{path="sql",reason="lease_held"}`
	afterExpiry := `fencegate_worker_lease_takeovers_total{how="after_expiry",path="sql"}`
	for series, want := range map[string]float64{stale: 0, held: 0, afterExpiry: 0} {
		if v := scrapeValue(t, g, series); v != want {
			t.Fatalf("before any worker: %s = %v, want %v (present from the start)", series, v, want)
		}
	}

	role := testdb.Role(t, pool, "counted_worker", testdb.WorkerGrants()...)
	a := testdb.ConnectAs(t, pool, role)
	b := testdb.ConnectAs(t, pool, role)
	sch := testdb.Schema()
	var epochA int64
	if err := a.QueryRow(ctx, `SELECT epoch FROM `+sch+`.acquire('sql-counted', 'A', '50 milliseconds')`).Scan(&epochA); err != nil {
		t.Fatal(err)
	}
	// B takes over once A's lease expired (by PostgreSQL's clock).
	var epochB int64
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := b.QueryRow(ctx, `SELECT epoch FROM `+sch+`.acquire('sql-counted', 'B', '1 minute')`).Scan(&epochB)
		if err == nil {
			break
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "ZF005" || time.Now().After(deadline) {
			t.Fatalf("B's acquire: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A, paused past its lease, writes in a transaction of its own: refused,
	// rolled back, nothing stored.
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, `SELECT * FROM `+sch+`.enqueue('sql-counted', $1, 'late', 'email', '{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t"}')`, epochA)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "ZF002" {
		t.Fatalf("A's late enqueue: %v, want ZF002 stale_epoch", err)
	}
	_ = tx.Rollback(ctx)
	// A's renew is refused too; A's acquire while B's lease is live as well.
	if _, err := a.Exec(ctx, `SELECT * FROM `+sch+`.renew('sql-counted', 'A', $1, '1 minute')`, epochA); !errors.As(err, &pe) || pe.Code != "ZF002" {
		t.Fatalf("A's renew: %v, want ZF002", err)
	}
	if _, err := a.Exec(ctx, `SELECT * FROM `+sch+`.acquire('sql-counted', 'A', '1 minute')`); !errors.As(err, &pe) || pe.Code != "ZF005" {
		t.Fatalf("A's acquire: %v, want ZF005", err)
	}
	// The gateway's own outbox refusing a stale write: counted by the
	// process, not in the database's counter.
	if _, err := g.Outbox().Enqueue(ctx, outbox.Intent{Resource: "sql-counted", Epoch: epochA, OperationID: "go-late", Kind: "email",
		Payload: []byte(`{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t"}`)}); !errors.Is(err, outbox.ErrStaleEpoch) {
		t.Fatalf("the gateway's stale enqueue: %v", err)
	}
	var stored int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+sch+`.intents WHERE resource_id = 'sql-counted'`).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("%d intents stored by refused writes (%v)", stored, err)
	}

	// At least 1 refused acquire while B waited for A's lease to expire
	// (each retry refused), and 1 after.
	if v := scrapeValue(t, g, held); v < 1 {
		t.Errorf("%s = %v, want at least 1", held, v)
	}
	for series, want := range map[string]float64{
		stale:       2, // the enqueue and the renew
		afterExpiry: 1,
		`fencegate_worker_lease_takeovers_total{how="free",path="sql"}`:   1,
		`fencegate_stale_epoch_rejections_total{where="enqueue"}`:         1,
		`fencegate_fence_refusals_total{path="cli",reason="stale_epoch"}`: 0,
	} {
		if v := scrapeValue(t, g, series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
	// The gateway's own issuer's grants are not the workers'.
	if _, err := lease.NewIssuer(pool, lease.WithSchema(sch)).Acquire(ctx, "go-counted", "G", time.Minute); err != nil {
		t.Fatal(err)
	}
	if v := scrapeValue(t, g, `fencegate_worker_lease_takeovers_total{how="free",path="sql"}`); v != 1 {
		t.Errorf("after a Go issuer's grant, the SQL workers' free takeovers = %v, want 1", v)
	}
}
