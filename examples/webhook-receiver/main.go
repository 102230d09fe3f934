// Command webhook-receiver is a webhook receiver that is safe for
// fencegate's webhooks, written to be copied: it
//
//  1. verifies the Standard Webhooks signature (webhook.Verify) on the raw
//     body before anything else, and refuses (401) what does not verify;
//  2. dedups on Idempotency-Key: a key it acted on gets the first answer
//     again, without a second effect (a lost answer makes the gateway
//     resend with the same key);
//  3. fences on Fencegate-Epoch: it keeps the highest epoch per
//     Fencegate-Resource and refuses an older one with 409 and
//     Fencegate-Current-Epoch (the gateway records the intent superseded)
//     — atomically with the write, so that a stale worker's late request
//     can never land after a newer one;
//  4. answers the lookup (GET /lookup, by the Idempotency-Key it carries):
//     200 with the first answer when the key was acted on, 404 when not.
//
// Its store is in memory under one mutex, which is what makes 2 and 3
// atomic with the write here; a real receiver does the same in one
// database transaction (docs/webhooks.md shows the SQL).
//
//	WEBHOOK_SECRET=whsec_... webhook-receiver --addr 127.0.0.1:9000
//	gateway run --adapters webhook --webhook-allow 127.0.0.1:9000 --webhook-dedups-on-key 127.0.0.1:9000 ...
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/fencegate/fencegate/adapters/webhook"
)

// Receiver is the handler. Effects counts what it acted on, by key.
type Receiver struct {
	secrets []webhook.Secret

	mu      sync.Mutex
	epochs  map[string]int64  // the highest epoch seen, by resource
	answers map[string][]byte // the answer given, by idempotency key
	Effects map[string]int
}

// New returns a receiver that accepts requests signed by one of secrets.
func New(secrets []webhook.Secret) *Receiver {
	return &Receiver{secrets: secrets, epochs: map[string]int64{}, answers: map[string][]byte{}, Effects: map[string]int{}}
}

// ServeHTTP: POST (or PUT, PATCH, DELETE) anywhere is the webhook; GET
// /lookup is the lookup.
func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/lookup" {
		rc.lookup(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	// 1. Who sent it: the raw body, before decoding anything.
	if err := webhook.Verify(rc.secrets, r.Header, body, time.Now(), 0); err != nil {
		http.Error(w, "signature: "+err.Error(), http.StatusUnauthorized)
		return
	}
	key := r.Header.Get(webhook.HeaderIdempotencyKey)
	resource := r.Header.Get(webhook.HeaderResource)
	epoch, err := strconv.ParseInt(r.Header.Get(webhook.HeaderEpoch), 10, 64)
	if key == "" || resource == "" || err != nil {
		http.Error(w, "Idempotency-Key, Fencegate-Resource and Fencegate-Epoch are required", http.StatusBadRequest)
		return
	}

	rc.mu.Lock()
	defer rc.mu.Unlock()
	// 2. Seen before: the same answer, no second effect. Checked before
	// the fence: a retry of an accepted request is not stale, even after
	// a newer epoch arrived.
	if answer, ok := rc.answers[key]; ok {
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
		return
	}
	// 3. The fence, under the same lock as the write: an epoch older
	// than the resource's is refused; an equal or newer one moves it.
	if cur := rc.epochs[resource]; epoch < cur {
		w.Header().Set(webhook.HeaderCurrentEpoch, strconv.FormatInt(cur, 10))
		http.Error(w, fmt.Sprintf("stale epoch %d for %s: current %d", epoch, resource, cur), http.StatusConflict)
		return
	}
	rc.epochs[resource] = epoch
	// The effect itself: here, only counted.
	rc.Effects[key]++
	answer, _ := json.Marshal(map[string]any{"accepted": key, "resource": resource, "epoch": epoch})
	rc.answers[key] = answer
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(answer)
}

// 4. The lookup: did the request with this key take effect?
func (rc *Receiver) lookup(w http.ResponseWriter, r *http.Request) {
	if err := webhook.Verify(rc.secrets, r.Header, nil, time.Now(), 0); err != nil {
		http.Error(w, "signature: "+err.Error(), http.StatusUnauthorized)
		return
	}
	rc.mu.Lock()
	answer, ok := rc.answers[r.Header.Get(webhook.HeaderIdempotencyKey)]
	rc.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(answer)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "listen address")
	flag.Parse()
	secrets, err := webhook.ParseSecrets("WEBHOOK_SECRET", webhook.SplitList(os.Getenv("WEBHOOK_SECRET")))
	if err != nil || len(secrets) == 0 {
		log.Fatalf("WEBHOOK_SECRET must hold the gateway's --webhook-secret (whsec_...): %v", err)
	}
	srv := &http.Server{Addr: *addr, Handler: New(secrets), ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.Background())
	}()
	log.Printf("webhook-receiver on http://%s", *addr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
