package cli

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// A webhook intent that failed, was retried, failed again (its last
// attempt: it ends failed) and was then cancelled shows both failures, each with its start, duration, process,
// error class and text and the Retry-After it set, in the API
// (attempt_history), the CLI (gateway status) and the intent's page; the
// intent's attempts count agrees with its history.
func TestAttemptHistoryRetriedThenCancelled(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	var hits atomic.Int32
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := hits.Add(1)
		w.Header().Set("Retry-After", "2")
		http.Error(w, "busy, try again (hit "+jsonNum(float64(n))+")", http.StatusServiceUnavailable)
	}))
	t.Cleanup(rcv.Close)
	host := strings.TrimPrefix(rcv.URL, "http://")
	admin := freeAddr(t)
	const secret = "op-secret-attempts-0123456789"
	p := e.run(t, []string{"GATEWAY_WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "GATEWAY_TOKENS=ops:operator:" + secret},
		"--adapters", "webhook", "--webhook-allow", host, "--admin-addr", admin, "--poll-interval", "200ms", "--max-attempts", "2")
	acquireLease(t, e.db, "billing")
	idv := enqueue(t, e.db, "--resource", "billing", "--epoch", "1", "--op", "charge-1", "--kind", "webhook",
		"--payload", `{"url":"`+rcv.URL+`/charge","body":{"amount":4200}}`)
	id := jsonNum(idv)

	waitStatus(t, e.db, idv, "failed")
	api := func(method, path string) (int, map[string]any) {
		req, _ := http.NewRequest(method, "http://"+admin+path, strings.NewReader(`{"note":"giving up"}`))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return res.StatusCode, m
	}
	if code, m := api("POST", "/api/v1/intents/"+id+"/cancel"); code != http.StatusOK {
		t.Fatalf("cancel: %d %v", code, m)
	}
	if got := hits.Load(); got != 2 {
		t.Fatalf("the receiver got %d requests before the cancel, want 2", got)
	}

	checkAttempts := func(where string, obj map[string]any) {
		t.Helper()
		list, _ := obj["attempt_history"].([]any)
		if len(list) != 2 {
			t.Fatalf("%s: attempt_history has %d entries, want 2: %v", where, len(list), obj["attempt_history"])
		}
		if obj["attempts"] != 2.0 {
			t.Errorf("%s: attempts = %v, want 2 (as many as attempt_history)", where, obj["attempts"])
		}
		for i, x := range list {
			a := x.(map[string]any)
			want := []string{"retry", "failed"}[i]
			if a["attempt"] != float64(i+1) || a["outcome"] != want || a["error_class"] != "retryable" {
				t.Errorf("%s: attempt %d = %v; want attempt %d, outcome %s, error_class retryable", where, i, a, i+1, want)
			}
			if msg, _ := a["error"].(string); !strings.Contains(msg, "503") {
				t.Errorf("%s: attempt %d error %q does not name the 503", where, i+1, msg)
			}
			if a["started_at"] == nil || a["duration_ms"] == nil || a["process"] == nil || (i == 0) != (a["not_before"] != nil) {
				t.Errorf("%s: attempt %d lacks started_at, duration_ms or process, or not_before is not set on the retried attempt alone: %v", where, i+1, a)
			}
			if a["retry_after_ms"] != 2000.0 {
				t.Errorf("%s: attempt %d retry_after_ms = %v, want 2000", where, i+1, a["retry_after_ms"])
			}
		}
	}
	code, m := api("GET", "/api/v1/intents/"+id)
	if code != http.StatusOK || m["status"] != "cancelled" {
		t.Fatalf("GET intent: %d %v", code, m)
	}
	checkAttempts("API", m)
	st := gw(t, e.db, "status", id)
	expectCode(t, st, 0, "")
	checkAttempts("gateway status", st.obj)

	req, _ := http.NewRequest("GET", "http://"+admin+"/intents/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+secret)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	html := string(page)
	table, _, _ := strings.Cut(html[strings.Index(html, `id="attempts"`)+1:], "</table>")
	if res.StatusCode != http.StatusOK || strings.Count(table, "<td class=\"outcome\">retry</td>") != 1 ||
		strings.Count(table, "<td class=\"outcome\">failed</td>") != 1 || strings.Count(table, "503") < 2 {
		t.Fatalf("intent page: %d; the attempts table does not show both failures:\n%s", res.StatusCode, table)
	}
	p.stop(t)
}
