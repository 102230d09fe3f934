package cli

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/smtptest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// actThenVanish is an HTTP receiver that performs every request (counts it
// by Idempotency-Key) and then drops the connection without answering: a
// crash after commit, a proxy reset. The fake is the destination only.
type actThenVanish struct {
	*httptest.Server
	mu  sync.Mutex
	got map[string]int
}

func newActThenVanish(t *testing.T) *actThenVanish {
	t.Helper()
	r := &actThenVanish{got: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		r.mu.Lock()
		r.got[req.Header.Get("Idempotency-Key")]++
		r.mu.Unlock()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *actThenVanish) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[key]
}

// Issue 27, case 2: with --unknown-outcome resend at destinations that
// dedup on the key (an SMTP server that stores each message and closes
// before answering the final dot; an HTTP receiver that acts and then
// closes), attempts whose outcome is lost never count as "did nothing":
// when --max-attempts runs out the intents end unknown (held for an
// operator), not failed, with their effect "possible" and their keys held
// (a later intent with the same business key does not run again). An
// operator's bulk retry or cancel of failed intents finds none of them.
func TestResendAfterUnknownOutcomesEndsUnknown(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	smtpSrv := smtptest.NewServer(t)
	smtpSrv.SetFault(smtptest.Fault{At: smtptest.PhaseData, Drop: true})
	rcv := newActThenVanish(t)
	host := strings.TrimPrefix(rcv.URL, "http://")
	e.run(t, nil, "--adapters", "email,webhook",
		"--smtp-addr", smtpSrv.Addr, "--smtp-starttls", "none", "--poll-interval", "200ms",
		"--unknown-outcome", "resend", "--smtp-dedups-on-message-id",
		"--webhook-allow", host, "--webhook-dedups-on-key", host, "--max-attempts", "2")

	acquireLease(t, e.db, "billing")
	mailID := enqueue(t, e.db, "--resource", "billing", "--epoch", "1", "--op", "mail-1", "--kind", "email", "--key", "invoice-7/mail",
		"--payload", `{"from":"billing@example.com","to":["a@example.com"],"subject":"Invoice 7","text":"due"}`)
	hookID := enqueue(t, e.db, "--resource", "billing", "--epoch", "1", "--op", "hook-1", "--kind", "webhook", "--key", "invoice-7/hook",
		"--payload", `{"url":"`+rcv.URL+`/charge","body":{"amount":7}}`)

	for _, c := range []struct {
		id        any
		kind, key string
		effects   func() int
	}{
		{mailID, "email", "invoice-7/mail", func() int { return len(smtpSrv.Messages()) }},
		{hookID, "webhook", "invoice-7/hook", func() int { return rcv.count("invoice-7/hook") }},
	} {
		st := waitStatus(t, e.db, c.id, "unknown")
		if st["effect"] != "possible" {
			t.Errorf("%s intent: effect %v, want possible: %v", c.kind, st["effect"], st)
		}
		if st["attempts"] != 2.0 {
			t.Errorf("%s intent: attempts %v, want 2", c.kind, st["attempts"])
		}
		if le, _ := st["last_error"].(string); le == "" {
			t.Errorf("%s intent: no last_error: an operator must see why it is unknown", c.kind)
		}
		if n := c.effects(); n != 2 {
			t.Errorf("%s: %d deliveries at the destination, want 2 (one per attempt, the destination dedups)", c.kind, n)
		}
		if n := testdb.Int(t, e.pool, `SELECT count(*) FROM fencegate.idempotency_keys WHERE kind = $1 AND idempotency_key = $2 AND state = 'held'`, c.kind, c.key); n != 1 {
			t.Errorf("%s: key %s not held (%d rows): a later intent with the same business key would run again", c.kind, c.key, n)
		}
	}
	// A bulk retry or cancel of failed intents touches neither.
	for _, action := range []string{"retry", "cancel"} {
		r := gw(t, e.db, action, "--status", "failed", "--yes")
		expectCode(t, r, 0, "")
		if r.obj["applied"] != 0.0 {
			t.Fatalf("gateway %s --status failed: %s, want nothing applied", action, r.stdout)
		}
	}
	if n := testdb.Int(t, e.pool, `SELECT count(*) FROM fencegate.intents WHERE status = 'unknown'`); n != 2 {
		t.Fatalf("%d unknown intents after the bulk actions, want 2", n)
	}
}

// retryAfterReceiver answers the first request of each key 503 with the
// Retry-After its path names ("/s/N": N seconds; "/d/N": an HTTP date N
// seconds ahead), and 200 afterwards, recording when each request came.
type retryAfterReceiver struct {
	*httptest.Server
	mu   sync.Mutex
	seen map[string][]time.Time
}

func newRetryAfterReceiver(t *testing.T) *retryAfterReceiver {
	t.Helper()
	r := &retryAfterReceiver{seen: map[string][]time.Time{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		key := req.Header.Get("Idempotency-Key")
		r.mu.Lock()
		r.seen[key] = append(r.seen[key], time.Now())
		first := len(r.seen[key]) == 1
		r.mu.Unlock()
		if !first {
			_, _ = w.Write([]byte(`{"ok":true}`))
			return
		}
		parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
		n, _ := strconv.Atoi(parts[1])
		if parts[0] == "d" {
			// An HTTP date has whole seconds: one more, so that the wait
			// is at least n seconds from now.
			w.Header().Set("Retry-After", time.Now().Add(time.Duration(n+1)*time.Second).UTC().Format(http.TimeFormat))
		} else {
			w.Header().Set("Retry-After", strconv.Itoa(n))
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *retryAfterReceiver) times(key string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.seen[key]...)
}

// Issue 27, case 3: a destination's back-pressure is honoured. A 503 with
// Retry-After (seconds, or an HTTP date) defers the next request by at
// least that long, although the relay timeout (1 s here) is far shorter:
// the deferred retry's not_before keeps the dispatcher from relaying it
// again early, and the intent shows when it is due. A Retry-After beyond
// --max-retry-after waits the bound, not the hour it asked for.
func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	rcv := newRetryAfterReceiver(t)
	host := strings.TrimPrefix(rcv.URL, "http://")
	e.run(t, nil, "--adapters", "webhook", "--webhook-allow", host,
		"--poll-interval", "100ms", "--relay-timeout", "1s", "--max-retry-after", "3s")
	acquireLease(t, e.db, "hooks")

	cases := []struct {
		path    string
		wantGap time.Duration
	}{
		{"/s/4", 3 * time.Second},    // asked 4 s, bounded at 3 s
		{"/d/2", 2 * time.Second},    // an HTTP date 2-3 s ahead
		{"/s/3600", 3 * time.Second}, // an hour asked, the bound waited
	}
	ids := make([]any, len(cases))
	for i, c := range cases {
		ids[i] = enqueue(t, e.db, "--resource", "hooks", "--epoch", "1", "--op", "op-"+strconv.Itoa(i), "--kind", "webhook",
			"--key", "k"+strconv.Itoa(i), "--payload", `{"url":"`+rcv.URL+c.path+`"}`)
	}
	// While deferred, the intent says when it is due (checked after the
	// gaps, which are what this test is about).
	var notBefore string
	pollUntil(t, 30*time.Second, "the deferred intent's not_before", func() (bool, string) {
		r := gw(t, e.db, "status", jsonNum(ids[2]))
		notBefore, _ = r.obj["not_before"].(string)
		return notBefore != "" || r.obj["status"] == "succeeded", r.stdout
	})
	for i, c := range cases {
		waitStatus(t, e.db, ids[i], "succeeded")
		got := rcv.times("k" + strconv.Itoa(i))
		if len(got) != 2 {
			t.Errorf("%s: %d requests, want 2", c.path, len(got))
			continue
		}
		gap := got[1].Sub(got[0])
		t.Logf("%s: second request %s after the first (want at least %s)", c.path, gap.Round(time.Millisecond), c.wantGap)
		if gap < c.wantGap {
			t.Errorf("%s: second request %s after the first, want at least %s", c.path, gap, c.wantGap)
		}
		if c.path == "/s/3600" && gap > time.Minute {
			t.Errorf("%s: waited %s, beyond --max-retry-after", c.path, gap)
		}
	}
	if notBefore == "" {
		t.Errorf("gateway status of a deferred intent shows no not_before")
	}
}
