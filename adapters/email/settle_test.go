package email_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/internal/testkit/smtptest"
	"github.com/fencegate/fencegate/outbox"
)

// The destination stores a message well after the gateway gave up waiting
// for its reply (a slow relay in front of Mailpit): every attempt's outcome
// is unknown, and Mailpit's lookup finds nothing for seconds. A lookup that
// finds nothing is not proof: the runtime must wait instead of sending
// again, and record the copy once it shows up. Exactly one message reaches
// Mailpit. (Before the settle window the runtime re-sent at once after each
// negative lookup, and Mailpit ended up with one copy per attempt started
// before the first one landed: three here, as in the field report.)
func TestRuntimeLateStoreSendsOnce(t *testing.T) {
	t.Parallel()
	mp := smtptest.StartMailpit(t)
	front := smtptest.NewServer(t, smtptest.WithUpstream(mp.SMTPAddr))
	const storeAfter = 3 * time.Second
	front.SetFault(smtptest.Fault{At: smtptest.PhaseData, StoreAfter: storeAfter})
	// The gateway gives up on the final reply after 1 s.
	a := newMailpitAdapter(t, mp, front.Addr, time.Second)
	e := adaptertest.NewEnv(t, adaptertest.Options{
		Executors: []adapters.Executor{a},
		Runtime: executor.Config{
			ExecuteTimeout: 2 * time.Second,
			AckWait:        10 * time.Second,
			// RetryBase and RetryMax stay at adaptertest's milliseconds, so
			// an immediate re-send would happen at once.
		},
	})
	key := uniqueKey(t)
	id := e.Enqueue(t, e.Intent(email.Kind, "op-1", key, emailPayload()))
	rec := e.WaitStatus(t, id, outbox.StatusSucceeded)
	if res := decodeResult(t, rec.Result); res["found_by"] != "lookup" {
		t.Fatalf("result = %s; want the late copy found by lookup", rec.Result)
	}
	// Let every send the front still holds land at Mailpit before counting.
	deadline := time.Now().Add(adaptertest.WaitTimeout)
	for front.Pending() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("front still holds %d messages", front.Pending())
		}
		time.Sleep(20 * time.Millisecond)
	}
	n, err := mp.CountMessageID(context.Background(), a.MessageID(key))
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("Mailpit holds %d copies of the message (attempts %d); want exactly 1", n, rec.Attempts)
	}
}

// Right before the end-of-data marker the adapter re-validates that its
// attempt still owns the key. When it does not, the marker is never sent:
// the server takes nothing, and the error says nothing happened
// (retryable, not unknown). When it does, the message goes out as usual.
func TestStillOwnerCheckedBeforeEndOfData(t *testing.T) {
	t.Parallel()
	srv := smtptest.NewServer(t)
	a := newAdapter(t, email.Config{Addr: srv.Addr, Timeout: 5 * time.Second})
	key := uniqueKey(t)
	var checks int
	lost := request(key, nil).WithOwnerCheck(func(context.Context) error {
		checks++
		return errors.New("key taken over")
	})
	_, err := a.Execute(context.Background(), lost)
	if err == nil || !adapters.IsRetryable(err) || adapters.IsUnknown(err) || !errors.Is(err, adapters.ErrNotOwner) {
		t.Fatalf("Execute after losing the key: %v; want a retryable ErrNotOwner", err)
	}
	if checks != 1 {
		t.Fatalf("owner checked %d times, want 1", checks)
	}
	if n := srv.Count(a.MessageID(key)); n != 0 || len(srv.Messages()) != 0 {
		t.Fatalf("the server took %d messages; want none without the end-of-data marker", len(srv.Messages()))
	}
	owned := request(key, nil).WithOwnerCheck(func(context.Context) error { checks++; return nil })
	if _, err := a.Execute(context.Background(), owned); err != nil {
		t.Fatal(err)
	}
	if n := srv.Count(a.MessageID(key)); n != 1 || checks != 2 {
		t.Fatalf("sent %d, checks %d; want 1 message after 1 more check", n, checks)
	}
}
