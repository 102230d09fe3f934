package gateway

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// A NATS outage is said once, not at every connection attempt (one a
// second for as long as it lasts): WARN for the first failed attempt and
// when the reason changes, DEBUG for the repeats, and WARN again for the
// first attempt of the next outage.
func TestFailedNATSAttemptsSaidOnce(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	a := &attemptLog{log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	refused := errors.New("dial tcp 127.0.0.1:4222: connect: connection refused")
	for range 30 {
		a.failed(refused)
	}
	a.failed(errors.New("nats: authorization violation"))
	a.reset()
	a.failed(refused)
	warns := strings.Count(logs.String(), "level=WARN")
	debugs := strings.Count(logs.String(), "level=DEBUG")
	if warns != 3 || debugs != 29 {
		t.Fatalf("%d WARN and %d DEBUG lines, want 3 (first, new reason, next outage) and 29; logs:\n%s", warns, debugs, logs.String())
	}
}
