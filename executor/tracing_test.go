package executor_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/internal/testkit/spantest"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
	"github.com/fencegate/fencegate/outbox"
)

// One trace shows enqueue → relay → effect: the worker's span, then the
// enqueue span stored with the intent, the dispatcher's relay span carried
// in the NATS headers, and the adapter's execution span — each the child of
// the one before, in time order, with the intent id and epoch as attributes.
// Not parallel: it installs the global tracer provider.
func TestOneTraceFromEnqueueToEffect(t *testing.T) {
	rec, tp := spantest.Install(t)

	e := setup(t, opts{})
	wctx, worker := tp.Tracer("worker").Start(context.Background(), "nightly-report-job")
	res, err := e.Client.Enqueue(wctx, e.Intent("test", "traced-op", "traced-key", []byte(`{"mode":"ok"}`)))
	worker.End()
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.waitTerminal(t, res.IntentID); rec.Status != outbox.StatusSucceeded {
		t.Fatalf("status = %s", rec.Status)
	}
	chain := []string{"nightly-report-job", "fencegate.enqueue", "fencegate.relay", "fencegate.execute"}
	// The execution span ends when the handler returns, after the outcome
	// it records has committed (and the message is acked): the status the
	// test saw can precede it. Wait for the whole chain, bounded.
	byName := map[string]sdktrace.ReadOnlySpan{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		clear(byName)
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == worker.SpanContext().TraceID() {
				byName[s.Name()] = s
			}
		}
		if len(byName) >= len(chain) || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i, name := range chain {
		s, ok := byName[name]
		if !ok {
			t.Fatalf("span %q missing from the worker's trace; have %v", name, keys(byName))
		}
		if i == 0 {
			continue
		}
		parent := byName[chain[i-1]]
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Fatalf("span %q's parent is %s, want %q (%s)", name, s.Parent().SpanID(), chain[i-1], parent.SpanContext().SpanID())
		}
		if s.StartTime().Before(parent.StartTime()) {
			t.Fatalf("span %q starts before its parent %q", name, chain[i-1])
		}
		if i >= 1 {
			attrs := spantest.Attrs(s)
			if attrs["fencegate.epoch"] != e.Epoch() {
				t.Fatalf("span %q epoch attribute = %v, want %d", name, attrs["fencegate.epoch"], e.Epoch())
			}
			if name != "fencegate.enqueue" || attrs["fencegate.intent_id"] != nil {
				if attrs["fencegate.intent_id"] != res.IntentID {
					t.Fatalf("span %q intent_id attribute = %v, want %d", name, attrs["fencegate.intent_id"], res.IntentID)
				}
			}
		}
	}
}

func keys(m map[string]sdktrace.ReadOnlySpan) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// installRecorder installs a tracer provider that records every span as
// the global one until the test ends. Tests that call it are not
// parallel.
func installRecorder(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	rec, _ := spantest.Install(t)
	return rec
}

// executeSpans waits until intent id's execute spans include one whose
// fencegate.outcome is last (the execute span ends after the outcome it
// records has committed), and returns them in the order they ended.
func executeSpans(t *testing.T, rec *tracetest.SpanRecorder, id int64, last string) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var out []sdktrace.ReadOnlySpan
		done := false
		for _, s := range rec.Ended() {
			if s.Name() != "fencegate.execute" || spantest.Attrs(s)["fencegate.intent_id"] != id {
				continue
			}
			out = append(out, s)
			done = done || spantest.Attrs(s)["fencegate.outcome"] == last
		}
		if done {
			return out
		}
		if time.Now().After(deadline) {
			var got []any
			for _, s := range out {
				got = append(got, spantest.Attrs(s)["fencegate.outcome"])
			}
			t.Fatalf("intent %d: execute spans with outcomes %v, none %q", id, got, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An execute span says how its delivery ended (fencegate.outcome, the
// attempt history's word) and is an error when the intent ended failed or
// unknown, described by the intent's last_error: a trace backend's error
// filter finds them. A retry, a success, are not errors. They all looked
// successful: status unset, no outcome.
// Not parallel: it installs the global tracer provider.
func TestExecuteSpanSaysTheOutcome(t *testing.T) {
	rec := installRecorder(t)
	e := setup(t, opts{})
	for _, tc := range []struct {
		name, payload string
		status        outbox.Status
		outcomes      []string // of the spans, in order
		errText       string   // the span's error description; "" not an error
	}{
		{"succeeded", `{"mode":"ok"}`, outbox.StatusSucceeded, []string{"succeeded"}, ""},
		{"retried, then succeeded", `{"mode":"retry","fail_times":1}`, outbox.StatusSucceeded, []string{"retry", "succeeded"}, ""},
		{"failed for good", `{"mode":"permanent"}`, outbox.StatusFailed, []string{"failed"}, "mailbox does not exist"},
		{"failed, attempts exhausted", `{"mode":"retry","fail_times":99}`, outbox.StatusFailed, []string{"retry", "retry", "failed"}, "gave up after 3 attempts"},
		{"unknown, held", `{"mode":"plain"}`, outbox.StatusUnknown, []string{"unknown"}, "connection reset by peer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "k-" + strings.ReplaceAll(tc.name, " ", "-")
			id := e.enqueue(t, key, key, tc.payload)
			r := e.waitTerminal(t, id)
			if r.Status != tc.status {
				t.Fatalf("status %s, want %s", r.Status, tc.status)
			}
			spans := executeSpans(t, rec, id, tc.outcomes[len(tc.outcomes)-1])
			if len(spans) != len(tc.outcomes) {
				t.Fatalf("%d execute spans, want %d", len(spans), len(tc.outcomes))
			}
			for i, s := range spans {
				if got := spantest.Attrs(s)["fencegate.outcome"]; got != tc.outcomes[i] {
					t.Errorf("span %d: fencegate.outcome %v, want %q", i, got, tc.outcomes[i])
				}
				want := codes.Unset
				if i == len(spans)-1 && tc.errText != "" {
					want = codes.Error
				}
				if st := s.Status(); st.Code != want {
					t.Errorf("span %d (%v): status %v %q, want %v", i, spantest.Attrs(s)["fencegate.outcome"], st.Code, st.Description, want)
				}
			}
			last := spans[len(spans)-1].Status()
			if tc.errText != "" && (!strings.Contains(last.Description, tc.errText) || r.LastError == nil || last.Description != *r.LastError) {
				t.Errorf("span status %q, want the intent's last_error %q, containing %q", last.Description, adaptertest.LastError(r), tc.errText)
			}
		})
	}
}

// The log lines of an attempt carry its execute span's trace_id and
// span_id (in gateway run's JSON logs), so a line joins its trace: the
// runtime logged without a context, and the ids were never there.
// Not parallel: it installs the global tracer provider.
func TestAttemptLogLinesJoinTheirSpan(t *testing.T) {
	rec := installRecorder(t)
	var logs toolbin.SyncBuffer
	e := setup(t, opts{logs: &logs, jsonLogs: true})
	id := e.enqueue(t, "logged", "logged", `{"mode":"retry","fail_times":1}`)
	if r := e.waitTerminal(t, id); r.Status != outbox.StatusSucceeded {
		t.Fatalf("status %s, want succeeded", r.Status)
	}
	spans := executeSpans(t, rec, id, "succeeded")
	bySpan := map[string]string{} // span id → trace id
	for _, s := range spans {
		bySpan[s.SpanContext().SpanID().String()] = s.SpanContext().TraceID().String()
	}
	joined, lines := 0, 0
	for _, line := range strings.Split(logs.String(), "\n") {
		var l struct {
			Msg      string `json:"msg"`
			IntentID int64  `json:"intent_id"`
			TraceID  string `json:"trace_id"`
			SpanID   string `json:"span_id"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.IntentID != id || !strings.HasPrefix(l.Msg, "adapters: ") {
			continue
		}
		lines++
		if tr, ok := bySpan[l.SpanID]; !ok || tr != l.TraceID {
			t.Errorf("log line %q: trace_id %q span_id %q, not one of the intent's execute spans %v", l.Msg, l.TraceID, l.SpanID, bySpan)
			continue
		}
		joined++
	}
	t.Logf("%d of %d log lines of intent %d joined to its %d execute spans", joined, lines, id, len(spans))
	if lines == 0 || joined != lines {
		t.Fatalf("%d of %d log lines joined; want every one, and at least one", joined, lines)
	}
}
