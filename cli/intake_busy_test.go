package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// `gateway run --lock-timeout` bounds the HTTP intake's enqueues too: with
// the resource's control row held by an open transaction (a worker paused
// inside EnqueueTx), POST /api/v1/intents answers 503 busy naming the
// resource, with Retry-After, and stores nothing; once the transaction
// ends, the same request is 201. Before, the request waited as long as the
// transaction stayed open (the client's own timeout here, 20 s).
func TestRunIntakeEnqueueBusy(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	const secret = "wrk-secret-0123456789abcdef"
	e := newRunEnv(t)
	p := e.run(t, []string{"GATEWAY_TOKENS=wrk:worker:" + secret}, "--adapters", "", "--admin-addr", addr, "--lock-timeout", "300ms")
	waitAdmin(t, addr)
	client := &http.Client{Timeout: 20 * time.Second}
	post := func(path, body string) (int, map[string]any, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		var obj map[string]any
		if err := json.Unmarshal(raw, &obj); err != nil {
			t.Fatalf("POST %s: %d %s", path, res.StatusCode, raw)
		}
		return res.StatusCode, obj, res.Header
	}
	code, l, _ := post("/api/v1/leases", `{"resource":"R","holder":"a","ttl_ms":60000}`)
	if code != http.StatusCreated {
		t.Fatalf("lease: %d %v", code, l)
	}
	intent := fmt.Sprintf(`{"resource":"R","epoch":%v,"operation_id":"op","kind":"email","payload":%s}`, l["epoch"], cliEmail)

	unlock := testdb.LockControlRow(t, e.pool, "R")
	code, obj, hdr := post("/api/v1/intents", intent)
	e1, _ := obj["error"].(map[string]any)
	if code != http.StatusServiceUnavailable || e1["code"] != "busy" || e1["resource"] != "R" || hdr.Get("Retry-After") == "" {
		t.Fatalf("enqueue behind a locked control row: %d %v (Retry-After %q); want 503 busy naming R, with Retry-After", code, obj, hdr.Get("Retry-After"))
	}
	if n := testdb.Int(t, e.pool, `SELECT count(*) FROM fencegate.intents WHERE resource_id = 'R'`); n != 0 {
		t.Fatalf("%d intents stored by the refused enqueue, want 0", n)
	}
	unlock()
	if code, obj, _ := post("/api/v1/intents", intent); code != http.StatusCreated {
		t.Fatalf("enqueue after the transaction ended: %d %v, want 201", code, obj)
	}
	p.stop(t)
}
