package gateway

import (
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// A NATS outage is said once, not at every connection attempt (one a
// second for as long as it lasts): WARN for the first failed attempt and
// when the reason changes, DEBUG for the repeats, and WARN again for the
// first attempt of the next outage.
func TestFailedNATSAttemptsSaidOnce(t *testing.T) {
	t.Parallel()
	var logs toolbin.SyncBuffer
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

// NATS down at start (the connection retried), then up, then down again
// for the same reason: the second outage's failed attempts are said at
// WARN too. A first connection that succeeds after retries calls
// nats.go's ConnectedCB, not ReconnectedCB, which left the log unreset:
// the second outage was at DEBUG only.
func TestNATSOutageAfterARetriedStartIsSaid(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	var logs toolbin.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	const said = "NATS connection attempt failed"
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(20 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s; logs:\n%s", what, logs.String())
			}
		}
	}
	nc, err := dialNATS("nats://127.0.0.1:"+strconv.Itoa(port), NATSAuth{}, time.Second, "", log)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	waitFor("no failed attempt at start", func() bool { return strings.Count(logs.String(), said) >= 2 })
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	waitFor("not connected", nc.IsConnected)
	mark := len(logs.String())
	s.Shutdown()
	waitFor("no failed attempt in the second outage", func() bool { return strings.Count(logs.String()[mark:], said) >= 2 })
	if second := logs.String()[mark:]; !strings.Contains(second, "level=WARN msg=\"gateway: "+said) {
		t.Fatalf("the second outage's failed attempts were not said at WARN:\n%s", second)
	}
}
