package webhook_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/webhook"
)

// A request that waited most of its execute timeout for one of the
// destination's MaxConcurrencyPerHost slots is not sent with what is
// left: cut short after it left, it would be an unknown outcome (held for
// an operator where the host neither dedups nor offers a lookup) for an
// effect that in fact happened. A soak burst of 1,194 intents to a host
// answering in 0-3 s, with the defaults' 8 slots and a 10 s execute
// timeout, held 979 of them unknown. Not sent, it is retried later.
func TestSlotWaitDoesNotEatTheRequestsTime(t *testing.T) {
	t.Parallel()
	first, second := adaptertest.UniqueKey(t)+"-first", adaptertest.UniqueKey(t)+"-second"
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Idempotency-Key") == first {
			time.Sleep(1500 * time.Millisecond)
		} else {
			time.Sleep(time.Second)
		}
		_, _ = w.Write([]byte("ok"))
	})
	a := newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}, MaxConcurrencyPerHost: 1})
	done := make(chan error, 1)
	go func() {
		_, err := execute(t, a, request(first, payload(rc.URL, nil)))
		done <- err
	}()
	for rc.total() < 1 {
		time.Sleep(5 * time.Millisecond)
	}
	// 2 s to execute, 1.5 s of them waiting for the slot.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := a.Execute(ctx, request(second, payload(rc.URL, nil)))
	if err := <-done; err != nil {
		t.Fatalf("first request: %v", err)
	}
	if adapters.IsUnknown(err) || !adapters.IsRetryable(err) {
		t.Errorf("a request left too little time by its wait for a slot: %v, want retryable (not sent), not unknown", err)
	}
	if n := len(rc.got(second)); n != 0 {
		t.Errorf("the receiver got %d requests for the second key, want 0 (not sent)", n)
	}
}
