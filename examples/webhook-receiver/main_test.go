package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/outbox"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// The receiver with the gateway's webhook adapter in front of it: a signed
// request takes effect once however often it is sent; a stale epoch is
// superseded at the receiver; an unsigned request is refused; the lookup
// answers found and not found.
func TestReceiverWithTheAdapter(t *testing.T) {
	secrets, _ := webhook.ParseSecrets("s", []string{secret})
	rc := New(secrets)
	srv := httptest.NewServer(rc)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	signed, err := webhook.New(webhook.Config{Allow: []string{host}, Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	unsigned, _ := webhook.New(webhook.Config{Allow: []string{host}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := func(key string, epoch int64) adapters.Request {
		p, _ := json.Marshal(map[string]any{"url": srv.URL + "/invoices", "body": map[string]any{"n": 1}, "lookup_url": srv.URL + "/lookup"})
		return adapters.Request{IntentID: 1, Resource: "billing", Epoch: epoch, Kind: "webhook", IdempotencyKey: key, Payload: p}
	}

	for range 2 {
		out, err := signed.Execute(ctx, req("inv-1", 2))
		if err != nil || out.Status != outbox.StatusSucceeded {
			t.Fatalf("signed request: %v %v", out.Status, err)
		}
	}
	if rc.Effects["inv-1"] != 1 {
		t.Errorf("%d effects of inv-1 sent twice, want 1", rc.Effects["inv-1"])
	}
	// A stale worker (epoch 1, after epoch 2 was seen): superseded.
	out, err := signed.Execute(ctx, req("inv-2", 1))
	if err != nil || out.Status != outbox.StatusSuperseded || !strings.Contains(string(out.Result), `"superseded_by_epoch":2`) {
		t.Errorf("stale request: %s %s %v, want superseded by epoch 2", out.Status, out.Result, err)
	}
	if rc.Effects["inv-2"] != 0 {
		t.Error("the stale request took effect")
	}
	if _, err := unsigned.Execute(ctx, req("inv-3", 2)); !adapters.IsPermanent(err) || !strings.Contains(err.Error(), "401") {
		t.Errorf("unsigned request: %v, want a permanent 401", err)
	}
	if _, found, err := signed.Lookup(ctx, req("inv-1", 2)); !found || err != nil {
		t.Errorf("lookup of inv-1: found %v, %v", found, err)
	}
	if _, found, err := signed.Lookup(ctx, req("inv-9", 2)); found || err != nil {
		t.Errorf("lookup of inv-9: found %v, %v; want not found", found, err)
	}
}
