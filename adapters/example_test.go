package adapters_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/outbox"
)

// webhook is an adapter of its own: kind "webhook" posts an event to a
// receiver that deduplicates on the Idempotency-Key header and answers
// GET /events/{key}. examples/custom-adapter is the whole program, with
// the kind registered and the conformance suite.
type webhook struct {
	URL    string
	Client *http.Client
}

var (
	_ adapters.Executor = (*webhook)(nil)
	_ adapters.Looker   = (*webhook)(nil)
)

type webhookPayload struct {
	Event string `json:"event"`
}

func (p webhookPayload) Validate() error {
	if p.Event == "" {
		return &fenceerr.InvalidError{Field: "payload.event", Message: "must not be empty"}
	}
	return nil
}

func (w *webhook) Kind() string { return "webhook" }

// Capabilities: the receiver answers lookups by key (Lookup: an unknown
// outcome is looked up, not held) and drops a second POST with the same
// key (DedupsOnKey: resending after an unknown outcome is safe).
func (w *webhook) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{Lookup: true, DedupsOnKey: true}
}

// Execute classifies every error it returns: an unclassified one would be
// taken as an unknown outcome, which costs a lookup or an operator.
func (w *webhook) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	var p webhookPayload
	if err := json.Unmarshal(req.Payload, &p); err != nil {
		return adapters.Outcome{}, adapters.PermanentError(&fenceerr.InvalidError{Field: "payload", Message: err.Error()})
	}
	if err := p.Validate(); err != nil {
		return adapters.Outcome{}, adapters.PermanentError(err) // never valid: no retry
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL+"/events", bytes.NewReader(req.Payload))
	if err != nil {
		return adapters.Outcome{}, adapters.PermanentError(err)
	}
	hr.Header.Set("Idempotency-Key", req.IdempotencyKey)
	// The POST is the irrevocable step: confirm ownership of the key
	// right before it. Not the owner: nothing was sent, retry.
	if err := req.StillOwner(ctx); err != nil {
		return adapters.Outcome{}, adapters.RetryableError(err)
	}
	resp, err := w.Client.Do(hr)
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		// No connection, so nothing was sent.
		return adapters.Outcome{}, adapters.RetryableError(err)
	case err != nil:
		// The request may have reached the receiver before the connection
		// failed: unknown, never "did not happen".
		return adapters.Outcome{}, adapters.UnknownError(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusCreated:
		return adapters.Outcome{Status: outbox.StatusSucceeded, Result: body}, nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		// Refused; the receiver dedups on the key, so a retry cannot
		// deliver twice.
		return adapters.Outcome{}, adapters.RetryableError(fmt.Errorf("webhook: %s", resp.Status))
	default:
		return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf("webhook: %s", resp.Status))
	}
}

// Lookup asks the receiver whether the key's event arrived.
func (w *webhook) Lookup(ctx context.Context, req adapters.Request) (adapters.Outcome, bool, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, w.URL+"/events/"+url.PathEscape(req.IdempotencyKey), nil)
	if err != nil {
		return adapters.Outcome{}, false, err
	}
	resp, err := w.Client.Do(hr)
	if err != nil {
		return adapters.Outcome{}, false, adapters.RetryableError(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch resp.StatusCode {
	case http.StatusOK:
		return adapters.Outcome{Status: outbox.StatusSucceeded, Result: body}, true, nil
	case http.StatusNotFound:
		return adapters.Outcome{}, false, nil
	}
	return adapters.Outcome{}, false, adapters.RetryableError(fmt.Errorf("webhook: lookup: %s", resp.Status))
}

// receiver is the destination: it keeps one event per key, answers 503 to
// event "busy" and drops the connection, after reading the request, on
// event "drop".
func receiver() *httptest.Server {
	var mu sync.Mutex
	ids := map[string]int{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /events", func(w http.ResponseWriter, r *http.Request) {
		var p webhookPayload
		_ = json.NewDecoder(r.Body).Decode(&p)
		switch p.Event {
		case "busy":
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		case "drop":
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		code := http.StatusOK // the same key again: the first event's answer
		if _, ok := ids[key]; !ok {
			ids[key] = len(ids) + 1
			code = http.StatusCreated
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"id":%d}`, ids[key])
	})
	mux.HandleFunc("GET /events/{key}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		id, ok := ids[r.PathValue("key")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	return httptest.NewServer(mux)
}

// An executor of its own kind, called as the runtime calls it, against a
// receiver that dedups on the key. What each error means to the runtime
// is its class: retryable (released and retried), permanent (failed), or
// else unknown (looked up here, since the executor declares Lookup).
func ExampleExecutor() {
	srv := receiver()
	defer srv.Close()
	w := &webhook{URL: srv.URL, Client: srv.Client()}
	ctx := context.Background()
	req := func(key, payload string) adapters.Request {
		return adapters.Request{IntentID: 1, Resource: "billing", Epoch: 3, Kind: w.Kind(),
			IdempotencyKey: key, Payload: json.RawMessage(payload), Attempt: 1}
	}
	class := func(err error) string {
		switch {
		case err == nil:
			return "succeeded"
		case adapters.IsRetryable(err):
			return "retryable"
		case adapters.IsPermanent(err):
			return "permanent"
		default: // adapters.UnknownError, or not classified at all
			return "unknown"
		}
	}
	for _, c := range []struct{ name, key, payload string }{
		{"paid", "billing/paid-42", `{"event":"invoice.paid"}`},
		{"paid again", "billing/paid-42", `{"event":"invoice.paid"}`},
		{"busy", "billing/b-1", `{"event":"busy"}`},
		{"dropped", "billing/d-1", `{"event":"drop"}`},
		{"no event", "billing/e-1", `{}`},
	} {
		out, err := w.Execute(ctx, req(c.key, c.payload))
		fmt.Println(strings.TrimSpace(c.name + ": " + class(err) + " " + string(out.Result)))
	}
	down := receiver()
	down.Close()
	_, err := (&webhook{URL: down.URL, Client: down.Client()}).Execute(ctx, req("billing/x-1", `{"event":"x"}`))
	fmt.Println("receiver down:", class(err))

	// After an unknown outcome the runtime looks the key up.
	for _, key := range []string{"billing/paid-42", "billing/d-1"} {
		out, found, err := w.Lookup(ctx, req(key, `{}`))
		if err != nil {
			fmt.Println("lookup", key+":", err)
			continue
		}
		fmt.Println(strings.TrimSpace(fmt.Sprintf("lookup %s: found %t %s", key, found, string(out.Result))))
	}
	// Output:
	// paid: succeeded {"id":1}
	// paid again: succeeded {"id":1}
	// busy: retryable
	// dropped: unknown
	// no event: permanent
	// receiver down: retryable
	// lookup billing/paid-42: found true {"id":1}
	// lookup billing/d-1: found false
}
