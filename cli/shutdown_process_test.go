package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
)

// slowReceiver is a webhook destination that holds every request for hold
// before it answers 200 (the effect done), and says on arrived when a
// request came in.
func slowReceiver(t *testing.T, hold time.Duration) (*httptest.Server, <-chan string) {
	t.Helper()
	arrived := make(chan string, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		arrived <- req.Header.Get("Idempotency-Key")
		time.Sleep(hold)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(srv.Close)
	return srv, arrived
}

// SIGTERM while an execution is in flight waits for it to finish and
// record its outcome, up to the execution's own timeout and a margin for
// the recording, then exits 0. The stop bound used to be a fixed 30 s,
// no longer than the default --execute-timeout: an execution that began
// just before the signal, or any with a longer --execute-timeout, was cut
// off after its request had left (exit 1, the intent relayed with its key
// owned and effect none until the key's lock expired, 5 min later).
func TestRunSIGTERMWaitsForASlowExecution(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	rcv, arrived := slowReceiver(t, 33*time.Second)
	host := strings.TrimPrefix(rcv.URL, "http://")
	p := e.run(t, nil, "--adapters", "webhook", "--webhook-allow", host,
		"--execute-timeout", "35s", "--poll-interval", "200ms")

	acquireLease(t, e.db, "slow")
	id := enqueue(t, e.db, "--resource", "slow", "--epoch", "1", "--op", "slow-1", "--kind", "webhook",
		"--payload", `{"url":"`+rcv.URL+`/hook","body":{"n":1}}`)
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatalf("the request never reached the receiver:\n%s", p.stderr.String())
	}
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 90*time.Second); code != 0 {
		t.Fatalf("exit %d %s after SIGTERM with an execution in flight, want 0 once it finished:\n%s",
			code, time.Since(start).Round(time.Millisecond), p.stderr.String())
	}
	t.Logf("exited 0 %s after SIGTERM", time.Since(start).Round(time.Millisecond))
	// The stopping process recorded the outcome itself.
	waitStatus(t, e.db, id, "succeeded")
	if log := p.stderr.String(); !strings.Contains(log, `msg="gateway: stopping" component=gateway in_flight=1`) {
		t.Errorf("the stopping line does not say what is in flight:\n%s", log)
	}
}

// outageSetup is a PostgreSQL cluster of the test's own (to stop and
// start again), migrated, a NATS server, and a receiver that holds each
// request for hold; host is the receiver's address for --webhook-allow.
func outageSetup(t *testing.T, hold time.Duration) (c *pgcluster.Cluster, db string, nats *natstest.Server, rcv *httptest.Server, arrived <-chan string, host string) {
	t.Helper()
	c, err := pgcluster.Start(context.Background(), pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	db = c.URL("postgres")
	expectCode(t, gw(t, db, "migrate"), 0, "")
	nats = natstest.Start(t)
	rcv, arrived = slowReceiver(t, hold)
	return c, db, nats, rcv, arrived, strings.TrimPrefix(rcv.URL, "http://")
}

// waitArrived waits for n requests at a slowReceiver (30 s at most).
func waitArrived(t *testing.T, arrived <-chan string, n int, p *gatewayProc) {
	t.Helper()
	for range n {
		select {
		case <-arrived:
		case <-time.After(30 * time.Second):
			t.Fatalf("the requests never reached the receiver:\n%s", p.stderr.String())
		}
	}
}

// outage stops c's PostgreSQL for d (a sleep: the outage's length is what
// the test is about), then starts it again.
func outage(t *testing.T, c *pgcluster.Cluster, d time.Duration) {
	t.Helper()
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d)
	if err := c.StartAgain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// An effect that happened while PostgreSQL was down is recorded once
// PostgreSQL is back, as long as the attempt still owns its key. The
// runtime retried the recording for half the AckWait only (30 s by
// default) and then dropped the outcome it knew: the key stayed owned
// until its lock expired, and then, the destination offering no lookup,
// the intent was held unknown for an operator ("an earlier attempt was
// abandoned"), though the receiver had answered 200. Here the AckWait is
// 10 s (5 s of retries before), PostgreSQL is down 15 s, and the key's
// lock 60 s.
func TestRunRecordsAnOutcomeKnownDuringAPostgresOutage(t *testing.T) {
	t.Parallel()
	c, db, nats, rcv, arrived, host := outageSetup(t, 3*time.Second)
	p := startRun(t, []string{"GATEWAY_ALLOW_FSYNC_OFF=true"}, db, nats.URL, "--adapters", "webhook", "--webhook-allow", host,
		"--execute-timeout", "5s", "--ack-wait", "10s", "--idempotency-lock-timeout", "60s", "--poll-interval", "200ms")

	epoch := acquireLease(t, db, "pgdown")
	id := enqueue(t, db, "--resource", "pgdown", "--epoch", epoch, "--op", "pgdown-1", "--kind", "webhook",
		"--payload", `{"url":"`+rcv.URL+`/hook","body":{"n":1}}`)
	waitArrived(t, arrived, 1, p)
	// Down while the request is held: its 200 comes with PostgreSQL away.
	outage(t, c, 15*time.Second)
	// Well before the key's lock (60 s from the Begin) expires.
	pollUntil(t, 25*time.Second, "the intent succeeded after PostgreSQL came back (the receiver answered 200)", func() (bool, string) {
		r := gw(t, db, "status", jsonNum(id), "-o", "json")
		if r.code == 0 && r.obj["status"] == "succeeded" {
			if r.obj["effect"] != "done" {
				t.Fatalf("succeeded with effect %v, want done", r.obj["effect"])
			}
			return true, ""
		}
		time.Sleep(200 * time.Millisecond) // each poll is a process
		return false, r.stdout
	})
	select {
	case k := <-arrived:
		t.Fatalf("a second request for %s", k)
	default:
	}
	p.stop(t)
}

// A PostgreSQL outage with executions in flight is said once, not once per
// intent at each retry of its recording: 5 executions finishing while it
// was down for 10 s logged about 200 warnings ("recording failed", and
// "a shared transaction failed" for each of their batches); with the
// adapters' default concurrency of 256, thousands.
func TestRunPostgresOutageIsLoggedOnce(t *testing.T) {
	t.Parallel()
	c, db, nats, rcv, arrived, host := outageSetup(t, 2*time.Second)
	p := startRun(t, []string{"GATEWAY_ALLOW_FSYNC_OFF=true"}, db, nats.URL, "--adapters", "webhook", "--webhook-allow", host, "--poll-interval", "200ms")

	epoch := acquireLease(t, db, "storm")
	var ids []any
	for i := range 5 {
		ids = append(ids, enqueue(t, db, "--resource", "storm", "--epoch", epoch, "--op", fmt.Sprintf("storm-%d", i), "--kind", "webhook",
			"--payload", `{"url":"`+rcv.URL+`/hook","body":{"n":1}}`))
	}
	waitArrived(t, arrived, len(ids), p)
	outage(t, c, 10*time.Second)
	for _, id := range ids {
		waitStatus(t, db, id, "succeeded")
	}
	log := p.stderr.String()
	if n := strings.Count(log, `level=WARN msg="adapters: recording failed; retrying"`); n != 1 {
		t.Errorf("%d warnings that recording failed during one outage, want 1:\n%s", n, log)
	}
	if n := strings.Count(log, `level=WARN msg="idempotency: a shared transaction failed`); n != 0 {
		t.Errorf("%d warnings of shared transactions that failed for want of a connection, want 0", n)
	}
	if !strings.Contains(log, `msg="adapters: recording works again"`) {
		t.Errorf("no line saying recording works again:\n%s", log)
	}
	// The relay's two loops, claiming and LISTENing, say it once each
	// too, and then that they work again (after their backoff's wait,
	// which may end after the intents settled): they warned at every
	// retry of their backoff (11 lines each in 10 s).
	for _, loop := range []struct{ failed, again string }{
		{"dispatcher: relay failed; backing off", "dispatcher: relaying works again"},
		{"dispatcher: listen failed; polling meanwhile", "dispatcher: listening again"},
	} {
		pollUntil(t, 45*time.Second, loop.again, func() (bool, string) {
			log = p.stderr.String()
			return strings.Contains(log, `level=INFO msg="`+loop.again+`"`), log
		})
		if n := strings.Count(log, `level=WARN msg="`+loop.failed); n != 1 {
			t.Errorf("%d warnings %q during one outage, want 1", n, loop.failed)
		}
	}
	if t.Failed() {
		t.Logf("the log:\n%s", log)
	}
	p.stop(t)
}
