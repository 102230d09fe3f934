package executor_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// An attempt whose outcome is unknown, at a destination that dedups (the
// resend policy), with a Retry-After: the key is kept and the retry
// deferred. An early redelivery of the intent resumes the key and, about to
// send again, finds the retry not due yet (BeginIO): it must come back when
// it is due, not take the deferral for a failed write and retry that write
// in a loop (the runtime's persist: warnings every 0.1–2 s until the
// deferral ends, or an error after half the AckWait). Fails on 72588cc:
// "recording failed; retrying … deferred".
func TestResumedKeyComesBackWhenItsRetryIsDue(t *testing.T) {
	t.Parallel()
	const wait = 3 * time.Second
	d := newRacingDest(&adapters.Error{Err: errors.New("503 after the request was read"), Unknown: true, RetryAfter: wait}, true)
	var logs toolbin.SyncBuffer
	// The early redelivery reads the intent before the first attempt
	// keeps the key for its retry: its load sees no deferral, its Begin
	// resumes the key, and its BeginIO finds the retry not due.
	raceTwoDeliveries(t, adaptertest.Options{Kinds: testKinds}, executor.Config{
		Unknown: executor.UnknownResend,
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}, d, d.entered, d.secondLoaded)
	out := logs.String()
	if strings.Contains(out, "recording failed") {
		t.Fatalf("the deferral was taken for a failed write and retried; logs:\n%s", out)
	}
	if !strings.Contains(out, "not due yet") {
		t.Fatalf("no redelivery found the retry not due: the path this test is about was not reached; logs:\n%s", out)
	}
	if n := d.checkSentAgainAfter(t, wait); n != 2 {
		t.Fatalf("%d executions, want 2 (the unknown one and the one after the Retry-After)", n)
	}
}
