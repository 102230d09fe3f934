package webhook_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
	"github.com/fencegate/fencegate/outbox"
)

// urlToken is a credential carried in a URL's query, as API keys are.
const urlToken = "URLTOKEN-6f3a9c"

// A URL's query never appears in an error the adapter returns, nor in its
// logs (docs/webhooks.md: "URLs in logs and errors show scheme, host and
// path, never the query"), however the request fails: no answer, no
// connection, an internal address, for the request and for its lookup.
// net/http's errors (*url.Error) print the whole URL; the adapter's errors
// name it redacted instead. Each error still says what happened (its
// class, errors.Is on its cause) and names the redacted URL.
func TestURLQueryNotInErrors(t *testing.T) {
	t.Parallel()
	hang := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) { <-r.Context().Done() })
	closed := newReceiver(t, nil)
	refused := closed.URL
	closed.Close()
	_, port, _ := strings.Cut(hang.hostPort(), ":")
	var logs toolbin.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a := newAdapter(t, webhook.Config{Allow: []string{"127.0.0.1"}, Logger: logger})
	// localhost listed, the address it resolves to not: refused at dial.
	internal := newAdapter(t, webhook.Config{Allow: []string{"localhost"}, Logger: logger})
	q := "?token=" + urlToken
	type call func(ctx context.Context, req adapters.Request) error
	execute := func(a *webhook.Adapter) call {
		return func(ctx context.Context, req adapters.Request) error { _, err := a.Execute(ctx, req); return err }
	}
	lookup := func(ctx context.Context, req adapters.Request) error { _, _, err := a.Lookup(ctx, req); return err }
	cases := []struct {
		name    string
		do      call
		payload string // the payload's url
		lookup  string // its lookup_url
		class   func(error) bool
		is      error // errors.Is must hold
		names   string
	}{
		{"execute, no answer", execute(a), hang.URL + "/x" + q, "", adapters.IsUnknown, context.DeadlineExceeded, hang.URL + "/x:"},
		{"execute, connection refused", execute(a), refused + "/x" + q, "", adapters.IsRetryable, nil, refused + "/x:"},
		{"execute, internal address", execute(internal), "http://localhost:" + port + "/x" + q, "", adapters.IsPermanent, webhook.ErrInternalAddress, "http://localhost:" + port + "/x:"},
		{"lookup, no answer", lookup, hang.URL + "/x", hang.URL + "/hanging-lookup" + q, func(err error) bool { return err != nil }, context.DeadlineExceeded, hang.URL + "/hanging-lookup:"},
		{"lookup, connection refused", lookup, hang.URL + "/x", refused + "/lookup" + q, func(err error) bool { return err != nil }, nil, refused + "/lookup:"},
	}
	checked := 0
	for _, tc := range cases {
		extra := map[string]any{}
		if tc.lookup != "" {
			extra["lookup_url"] = tc.lookup
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := tc.do(ctx, request(adaptertest.UniqueKey(t), payload(tc.payload, extra)))
		cancel()
		checked++
		switch {
		case err == nil:
			t.Errorf("%s: no error", tc.name)
			continue
		case strings.Contains(err.Error(), urlToken):
			t.Errorf("%s: the error carries the URL's query: %v", tc.name, err)
		case !strings.Contains(err.Error(), tc.names):
			t.Errorf("%s: error %q does not name the URL %s (redacted)", tc.name, err, tc.names)
		}
		if !tc.class(err) {
			t.Errorf("%s: %v, classified wrongly", tc.name, err)
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: %v, want errors.Is %v", tc.name, err, tc.is)
		}
	}
	t.Logf("checked %d failures", checked)
	if checked == 0 {
		t.Fatal("no case checked")
	}
	if strings.Contains(logs.String(), urlToken) {
		t.Errorf("the logs carry the URL's query: %s", logs.String())
	}
}

// The same through the runtime: a request that gets no answer within the
// execute timeout is held unknown; neither its last_error nor its attempt
// history carries the URL's query.
func TestRuntimeURLQueryNotInLastError(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) { <-r.Context().Done() })
	e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}}, adaptertest.Options{Runtime: executor.Config{Unknown: executor.UnknownResend}})
	key := adaptertest.UniqueKey(t)
	id := enqueue(t, e, key, payload(rc.URL+"/x?token="+urlToken, nil))
	rec := e.WaitStatus(t, id, outbox.StatusUnknown)
	if rec.LastError == nil || !strings.Contains(*rec.LastError, rc.URL+"/x:") || strings.Contains(*rec.LastError, urlToken) {
		t.Errorf("last_error %s: want the URL without its query", deref(rec.LastError))
	}
	rows, err := e.Pool.Query(context.Background(), adaptertest.SQL("SELECT coalesce(error, '') FROM fencegate.intent_attempts WHERE intent_id = $1"), id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var msg string
		if err := rows.Scan(&msg); err != nil {
			t.Fatal(err)
		}
		n++
		if strings.Contains(msg, urlToken) {
			t.Errorf("attempt history error %q carries the URL's query", msg)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("checked %d attempts", n)
	if n == 0 {
		t.Fatal("no attempt recorded")
	}
}

func deref(s *string) string {
	if s == nil {
		return "(none)"
	}
	return *s
}
