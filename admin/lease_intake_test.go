package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Every acquire answers 201 with a new, higher epoch, also for the holder
// that already holds the lease; renew keeps the epoch; the orphaned epoch
// of the first grant is fenced.
func TestIntakeAcquireIsAlwaysANewEpoch(t *testing.T) {
	e := setup(t)
	body := `{"resource":"report","holder":"a","ttl_ms":60000}`
	r := e.do("POST", "/api/v1/leases", workerSecret, body)
	expect(t, r, http.StatusCreated, "")
	first := num(r.obj["epoch"])
	r = e.do("POST", "/api/v1/leases", workerSecret, body) // the same request again (a lost response)
	expect(t, r, http.StatusCreated, "")
	second := num(r.obj["epoch"])
	if first < 1 || second <= first || r.obj["holder"] != "a" {
		t.Fatalf("second acquire by the same holder = %s; want 201 with an epoch above %d", r.raw, first)
	}
	r = e.do("POST", "/api/v1/intents", workerSecret, emailIntent("report", first, "op-orphan"))
	expect(t, r, http.StatusConflict, "stale_epoch")
	if num(r.errField("current_epoch")) != second {
		t.Fatalf("stale = %s; want current_epoch %d", r.raw, second)
	}
	r = e.do("POST", "/api/v1/leases/renew", workerSecret,
		`{"resource":"report","holder":"a","epoch":`+strconv.FormatInt(second, 10)+`,"ttl_ms":60000}`)
	expect(t, r, http.StatusOK, "")
	if num(r.obj["epoch"]) != second {
		t.Fatalf("renew = %s; want epoch %d kept", r.raw, second)
	}
}

// Epochs above 2^53 are 400 naming epoch, nothing stored; a resource at the
// ceiling answers acquire with 400 naming epoch, saying its epochs are
// exhausted (never a 500).
func TestIntakeEpochCeiling(t *testing.T) {
	e := setup(t)
	for _, big := range []string{"9007199254740993", "9223372036854775807", "9223372036854775808"} {
		expectField(t, e.do("POST", "/api/v1/epochs", workerSecret, `{"resource":"r","epoch":`+big+`}`), "epoch")
		expectField(t, e.do("POST", "/api/v1/leases/renew", workerSecret, `{"resource":"r","holder":"a","epoch":`+big+`,"ttl_ms":1000}`), "epoch")
		expectField(t, e.do("POST", "/api/v1/leases/release", workerSecret, `{"resource":"r","holder":"a","epoch":`+big+`}`), "epoch")
		expectField(t, e.do("POST", "/api/v1/intents", workerSecret, strings.Replace(emailIntent("r", 1, "op"), `"epoch":1`, `"epoch":`+big, 1)), "epoch")
	}
	if n := e.count(`SELECT count(*) FROM fencegate.resources`) + e.count(`SELECT count(*) FROM fencegate.intents`); n != 0 {
		t.Fatalf("rows stored after bad epochs: %d", n)
	}
	r := e.do("POST", "/api/v1/epochs", workerSecret, `{"resource":"r","epoch":9007199254740992}`)
	expect(t, r, http.StatusCreated, "")
	if r.raw == "" || !strings.Contains(r.raw, `"epoch":9007199254740992`) {
		t.Fatalf("advance to the ceiling = %s", r.raw)
	}
	r = e.do("POST", "/api/v1/leases", workerSecret, `{"resource":"r","holder":"a","ttl_ms":60000}`)
	expectField(t, r, "epoch")
	if msg, _ := r.errField("message").(string); !strings.Contains(msg, "exhausted") {
		t.Fatalf("acquire at the ceiling = %s; the message should say the epochs are exhausted", r.raw)
	}
}

// A grant that cannot get the control-row lock within the issuer's lock
// timeout (a worker paused inside EnqueueTx holds it) answers 503 busy with
// Retry-After, naming the resource; afterwards the takeover works.
func TestIntakeBusy(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	s := newServer(t, pool, testTokens, func(c *Config) {
		c.Issuer = lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()), lease.WithLockTimeout(200*time.Millisecond))
	})
	e := &env{t: t, pool: pool, srv: s, issuer: s.cfg.Issuer, ob: s.cfg.Outbox}
	e.ts = httptest.NewServer(s.Handler())
	t.Cleanup(e.ts.Close)
	ctx := context.Background()
	r := e.do("POST", "/api/v1/leases", workerSecret, `{"resource":"R","holder":"a","ttl_ms":60000}`)
	expect(t, r, http.StatusCreated, "")
	epoch := num(r.obj["epoch"])

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var in outbox.Intent
	if err := json.Unmarshal([]byte(emailIntent("R", epoch, "paused")), &in); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ob.EnqueueTx(ctx, tx, in); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, body string }{
		{"/api/v1/leases", `{"resource":"R","holder":"b","ttl_ms":60000}`},
		{"/api/v1/epochs", `{"resource":"R","epoch":100}`},
		{"/api/v1/leases/renew", `{"resource":"R","holder":"a","epoch":` + strconv.FormatInt(epoch, 10) + `,"ttl_ms":60000}`},
	} {
		r := e.do("POST", c.path, workerSecret, c.body)
		expect(t, r, http.StatusServiceUnavailable, "busy")
		if r.hdr.Get("Retry-After") == "" || r.errField("resource") != "R" {
			t.Fatalf("%s: busy answer %s (Retry-After %q); want Retry-After and the resource", c.path, r.raw, r.hdr.Get("Retry-After"))
		}
		if msg, _ := r.errField("message").(string); !strings.Contains(msg, "locked by an open transaction") {
			t.Fatalf("%s: message %q should say why", c.path, msg)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.resources SET lease_expires_at = now() - interval '1 millisecond' WHERE resource_id = 'R'`)); err != nil {
		t.Fatal(err)
	}
	r = e.do("POST", "/api/v1/leases", workerSecret, `{"resource":"R","holder":"b","ttl_ms":60000}`)
	expect(t, r, http.StatusCreated, "")
	if num(r.obj["epoch"]) != epoch+1 {
		t.Fatalf("takeover after the transaction ended = %s; want epoch %d", r.raw, epoch+1)
	}
}
