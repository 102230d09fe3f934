package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/outbox"
)

// Kind is the intent kind of this example adapter: post a notification to
// a chat-like HTTP service.
const Kind = "notify"

// Payload is the kind's typed payload.
type Payload struct {
	Channel string `json:"channel"`
	Text    string `json:"text"`
}

// Validate checks a payload; it is the one place the kind's rules live, used
// at enqueue (KindSpec) and at execute.
func (p Payload) Validate() error {
	switch {
	case p.Channel == "":
		return &outbox.ValidationError{Field: "payload.channel", Message: "must not be empty"}
	case len(p.Text) == 0 || len(p.Text) > 4000:
		return &outbox.ValidationError{Field: "payload.text", Message: "must be 1-4000 bytes"}
	}
	return nil
}

// KindSpec is the kind's intake rules: fence commit, the payload parsed
// with outbox.ParsePayload[Payload] (strict JSON, names matched exactly,
// then Validate), the same parse Execute does.
func KindSpec() outbox.KindSpec {
	return outbox.TypedKind[Payload](outbox.FenceCommit)
}

// Registration is the adapter, registered once: its kind, its intake rules
// and its executor, posting to endpoint. The gateway command line
// (cli.Options.Adapters) and the composition root (gateway.Config.Adapters)
// take the same value.
func Registration(endpoint string) adapters.Registration {
	return adapters.Registration{Kind: Kind, Spec: KindSpec(), Executor: &Notifier{Endpoint: endpoint}}
}

// Notifier posts notifications to Endpoint:
//
//	POST {Endpoint}/messages         Idempotency-Key, Fencegate-Epoch headers; 201 or 200 (the same key again)
//	GET  {Endpoint}/messages/{key}   200 with the message, 404 when the key was never posted
//
// The service deduplicates on Idempotency-Key, so sending again after an
// unknown outcome is safe (Capabilities.DedupsOnKey), and it answers a
// lookup by key (Capabilities.Lookup).
type Notifier struct {
	Endpoint string
	Client   *http.Client
}

var (
	_ adapters.Executor = (*Notifier)(nil)
	_ adapters.Looker   = (*Notifier)(nil)
)

// Kind is the kind it serves.
func (n *Notifier) Kind() string { return Kind }

// Capabilities: the service answers lookups and dedups on the key; at most
// 32 requests at once.
func (n *Notifier) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{Lookup: true, DedupsOnKey: true, Concurrency: 32}
}

// Execute posts the notification. Every error is classified: only the
// adapter knows whether the effect may have happened.
func (n *Notifier) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	p, err := outbox.ParsePayload[Payload](req.Payload)
	if err != nil {
		return adapters.Outcome{}, adapters.PermanentError(err) // never valid: do not retry
	}
	body, _ := json.Marshal(p)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, n.Endpoint+"/messages", bytes.NewReader(body))
	if err != nil {
		return adapters.Outcome{}, adapters.PermanentError(err)
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Idempotency-Key", req.IdempotencyKey)
	hr.Header.Set("Fencegate-Epoch", strconv.FormatInt(req.Epoch, 10))
	if err := ctx.Err(); err != nil {
		return adapters.Outcome{}, adapters.RetryableError(err) // nothing sent yet
	}
	// The request is the irrevocable step: re-check ownership right before.
	if err := req.StillOwner(ctx); err != nil {
		return adapters.Outcome{}, adapters.RetryableError(err) // nothing sent
	}
	resp, err := n.client().Do(hr)
	if err != nil {
		// The request may have reached the service before the connection
		// failed: unknown, never "did not happen".
		return adapters.Outcome{}, adapters.UnknownError(fmt.Errorf("notify: post: %w", err))
	}
	defer resp.Body.Close()
	res, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusCreated:
		return outcome(res)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		// Refused before the service processed it: the post did not
		// happen, so this is a plain retry.
		return adapters.Outcome{}, adapters.RetryableError(fmt.Errorf("notify: %s", resp.Status))
	case resp.StatusCode >= 500:
		// The service failed while or after posting: the post may have
		// happened. Unknown, never "did not happen" (which would release
		// the key and could end failed for a post that was made); the
		// runtime resends with the same key, since the service dedups on
		// it (DedupsOnKey), or looks the key up.
		return adapters.Outcome{}, adapters.UnknownError(fmt.Errorf("notify: %s", resp.Status))
	default:
		return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf("notify: %s: %s", resp.Status, bytes.TrimSpace(res)))
	}
}

// Lookup asks the service whether the key was posted.
func (n *Notifier) Lookup(ctx context.Context, req adapters.Request) (adapters.Outcome, bool, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, n.Endpoint+"/messages/"+url.PathEscape(req.IdempotencyKey), nil)
	if err != nil {
		return adapters.Outcome{}, false, err
	}
	resp, err := n.client().Do(hr)
	if err != nil {
		return adapters.Outcome{}, false, adapters.RetryableError(err)
	}
	defer resp.Body.Close()
	res, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch resp.StatusCode {
	case http.StatusOK:
		out, err := outcome(res)
		return out, err == nil, err
	case http.StatusNotFound:
		return adapters.Outcome{}, false, nil
	}
	return adapters.Outcome{}, false, adapters.RetryableError(fmt.Errorf("notify: lookup: %s", resp.Status))
}

func outcome(res []byte) (adapters.Outcome, error) {
	if !json.Valid(res) || len(res) == 0 || res[0] != '{' {
		return adapters.Outcome{}, adapters.UnknownError(errors.New("notify: the service answered success without a JSON object"))
	}
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: res}, nil
}

func (n *Notifier) client() *http.Client {
	if n.Client != nil {
		return n.Client
	}
	return &http.Client{Timeout: 10 * time.Second}
}
