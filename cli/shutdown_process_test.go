package cli

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"
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
