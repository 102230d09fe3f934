package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// FuzzDecodeIntent posts arbitrary bodies to the intake: it never panics,
// never answers 5xx, always answers a JSON object, and stores an intent
// only when it answers 201 (exactly one) — an error stores nothing. The
// corpus under testdata/fuzz/FuzzDecodeIntent runs as regression seeds
// with every `go test`.
func FuzzDecodeIntent(f *testing.F) {
	for _, seed := range []string{
		emailIntent("r", 1, "op"),
		`{"resource":"r","epoch":1,"operation_id":"f","kind":"file","payload":{"target":"a/b.txt","content":"x"}}`,
		`{"resource":"r","epoch":1,"operation_id":"f","kind":"file","fence":"commit","idempotency_key":"k","payload":{"target":"a.txt","content_base64":"eA=="}}`,
		`{"resource":"r","epoch":2,"operation_id":"s","kind":"email","payload":{}}`,
		`{"resource":"r","epoch":1,"operation_id":"op","kind":"email","payload":{"to":["a@b.c",1]}}`,
		`{"resource":"r","epoch":1,"x":1}`,
		`{"resource":"r"} {}`,
		`[{"resource":"r"}]`,
		`{"epoch":1e400}`,
		`{"payload":"\u0000"}`,
		`{"resource":"\ud800","epoch":-1}`,
		`null`,
		``,
	} {
		f.Add([]byte(seed))
	}
	pool := testdb.New(f)
	s := newServer(f, pool, testTokens, func(c *Config) { c.MaxBodyBytes = 4096 })
	if _, err := s.cfg.Issuer.Advance(context.Background(), "r", 1); err != nil {
		f.Fatal(err)
	}
	h := s.Handler()
	count := func(t *testing.T) int {
		var n int
		if err := pool.QueryRow(context.Background(), testdb.SQL(`SELECT count(*) FROM fencegate.intents`)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		before := count(t)
		req := httptest.NewRequest("POST", "/api/v1/intents", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+workerSecret)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var obj map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &obj); err != nil {
			t.Fatalf("status %d: body is not JSON: %q", rec.Code, rec.Body.String())
		}
		after := count(t)
		switch rec.Code {
		case http.StatusCreated:
			if after != before+1 {
				t.Fatalf("201 but intents %d → %d", before, after)
			}
		case http.StatusOK, http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity:
			if after != before {
				t.Fatalf("status %d stored: intents %d → %d (%s)", rec.Code, before, after, rec.Body.String())
			}
			if rec.Code == http.StatusBadRequest {
				e, _ := obj["error"].(map[string]any)
				if f, _ := e["field"].(string); f == "" {
					t.Fatalf("400 without a field: %s", rec.Body.String())
				}
			}
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
	})
}
