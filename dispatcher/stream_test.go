package dispatcher_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/wire"
)

// The stream is transport, not a record: an intent's outcome is in
// PostgreSQL, and a message the broker no longer has is relayed again
// after RelayTimeout. So the stream the dispatcher sets up must not keep
// every message ever relayed: one created with no limit (limits retention,
// no MaxAge, MaxMsgs or MaxBytes) grows by every intent for ever (a soak
// run at ~180 intents/s: 77 KB/s of stream, never trimmed), and a durable
// consumer created again (DeliverAll) replays the whole history.
func TestStreamIsBounded(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.start(dispatcher.Config{Schema: testdb.Schema()})
	ctx := context.Background()
	epoch := e.acquire("bounded")
	if _, err := e.ob.Enqueue(ctx, fileIntent("bounded", epoch, "op", 100)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the intent in the stream", func() (bool, string) {
		return len(readStream(t, e.js)) == 1, "not yet"
	})
	s, err := e.js.Stream(ctx, wire.Namespace("").Stream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := info.Config
	if c.MaxAge <= 0 && c.MaxMsgs <= 0 && c.MaxBytes <= 0 {
		t.Fatalf("stream %s keeps every message for ever: retention %s, MaxAge %s, MaxMsgs %d, MaxBytes %d",
			c.Name, c.Retention, c.MaxAge, c.MaxMsgs, c.MaxBytes)
	}
	if c.MaxAge < c.Duplicates {
		t.Errorf("MaxAge %s shorter than the duplicate window %s", c.MaxAge, c.Duplicates)
	}
}

// With a short StreamMaxAge, a relayed message leaves the stream once it is
// that old (the intent stays relayed in PostgreSQL, for the re-relay).
func TestStreamMaxAgeTrimsRelayedMessages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.start(dispatcher.Config{Schema: testdb.Schema(), PublishTimeout: time.Second, ClaimTTL: 2 * time.Second,
		DuplicateWindow: 3 * time.Second, StreamMaxAge: 3 * time.Second, RelayTimeout: time.Hour})
	ctx := context.Background()
	epoch := e.acquire("trimmed")
	if _, err := e.ob.Enqueue(ctx, fileIntent("trimmed", epoch, "op", 100)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the intent in the stream", func() (bool, string) {
		return len(readStream(t, e.js)) == 1, "not yet"
	})
	waitFor(t, 15*time.Second, "the stream trimmed", func() (bool, string) {
		n := len(readStream(t, e.js))
		return n == 0, fmt.Sprintf("%d messages", n)
	})
}

func TestStreamMaxAgeAtLeastDuplicateWindow(t *testing.T) {
	t.Parallel()
	coretest.Refused(t, map[string]func() error{
		"StreamMaxAge": dispatcher.Config{DuplicateWindow: 10 * time.Minute, StreamMaxAge: 5 * time.Minute}.Validate,
	})
	for _, c := range []struct {
		cfg  dispatcher.Config
		want time.Duration
	}{
		{dispatcher.Config{}, time.Hour},
		{dispatcher.Config{ClaimTTL: time.Hour, DuplicateWindow: 2 * time.Hour}, 2 * time.Hour},
		{dispatcher.Config{StreamMaxAge: 5 * time.Minute}, 5 * time.Minute},
	} {
		if err := c.cfg.Validate(); err != nil {
			t.Errorf("%+v: %v", c.cfg, err)
		}
		if got := c.cfg.StreamConfig().MaxAge; got != c.want {
			t.Errorf("%+v: stream MaxAge %s, want %s", c.cfg, got, c.want)
		}
	}
}
