package lease_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
)

// Environment of the pause helper process.
const (
	envPauseHelper = "FENCEGATE_PAUSE_HELPER_DB"
	envPauseTTL    = "FENCEGATE_PAUSE_HELPER_TTL"
	envPauseTick   = "FENCEGATE_PAUSE_HELPER_TICK"
)

// TestPauseHelper is not a test: it is the body of the subprocess that
// TestKeeperDetectsSIGSTOP stops and continues. It holds a lease with a
// Keeper whose logs go to stdout as JSON lines, announces itself with a
// "ready" line, and reports when the Keeper's context ends.
func TestPauseHelper(t *testing.T) {
	dbURL := os.Getenv(envPauseHelper)
	if dbURL == "" {
		t.Skip("helper process for TestKeeperDetectsSIGSTOP")
	}
	ttl, err := time.ParseDuration(os.Getenv(envPauseTTL))
	if err != nil {
		t.Fatal(err)
	}
	tick, err := time.ParseDuration(os.Getenv(envPauseTick))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	k, err := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())).Hold(ctx, "paused", "helper", lease.KeeperConfig{
		TTL: ttl, Logger: log, PauseLogFraction: 0.05, PauseTick: tick})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	// Ready once the detector runs: a stop from now on is a pause it sees.
	for tick >= 0 && k.Pauses().Samples == 0 {
		time.Sleep(time.Millisecond)
	}
	log.Info("ready", "epoch", k.Epoch())
	select {
	case <-k.Context().Done():
		<-k.Stopped() // the detector has recorded what it saw
		log.Info("context done", "cause", k.Err().Error(), "max_pause", k.MaxPause(), "last_pause", k.LastPause(), "samples", k.Pauses().Samples)
	case <-time.After(time.Minute):
	}
}

// A real process pause: the parent SIGSTOPs a child holding a lease, then
// SIGCONTs it. The child's Keeper reports a pause as long as the stop; when
// the pause outlasts the lease's trust, the Keeper's context is cancelled
// right after the process resumes.
func TestKeeperDetectsSIGSTOP(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		ttl      time.Duration
		tick     time.Duration
		stop     time.Duration
		wantLost bool
	}{
		// 300ms stop, 3s TTL: logged (above 5% of the TTL), lease kept.
		{"short pause", 3 * time.Second, 0, 300 * time.Millisecond, false},
		// 1.5s stop, 1s TTL: past the trust deadline, the context ends.
		{"pause past the lease", time.Second, 0, 1500 * time.Millisecond, true},
		// The same without the pause detector: the renew loop's deadline
		// timer alone cancels the context as soon as the process runs.
		{"pause past the lease, no detector", time.Second, -1, 1500 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestPauseHelper$", "-test.count=1")
			cmd.Env = append(os.Environ(), envPauseHelper+"="+testdb.NewURL(t), envPauseTTL+"="+tc.ttl.String(), envPauseTick+"="+tc.tick.String())
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = cmd.Process.Signal(syscall.SIGCONT)
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			})
			lines := readJSONLines(out)
			next := func(within time.Duration, msg string) map[string]any {
				t.Helper()
				timeout := time.After(within)
				for {
					select {
					case l, ok := <-lines:
						if !ok {
							t.Fatalf("helper exited before logging %q", msg)
						}
						if l["msg"] == msg {
							return l
						}
						if l["msg"] == "lease: keeper: lease lost" && msg != l["msg"] {
							t.Fatalf("helper lost its lease before %q: %v", msg, l)
						}
					case <-timeout:
						t.Fatalf("helper did not log %q within %s", msg, within)
					}
				}
			}
			next(30*time.Second, "ready")

			if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped := time.Now()
			// The stop's length is the experiment: a timer, not a wait.
			time.Sleep(tc.stop)
			if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			resumed := time.Now()
			stoppedFor := resumed.Sub(stopped)

			if tc.wantLost {
				// Whichever of the Keeper's goroutines runs first after the
				// pause cancels the context; the lost line may come before
				// the pause line.
				lost := next(10*time.Second, "lease: keeper: lease lost")
				done := next(10*time.Second, "context done")
				// Cancelled as soon as the process ran again, not at some
				// later renewal (the bound only absorbs a busy machine).
				if after := time.Since(resumed); after > 2*time.Second {
					t.Fatalf("context ended %s after the process resumed", after)
				}
				if cause, _ := done["cause"].(string); !strings.HasPrefix(cause, lease.ErrLeaseLost.Error()) {
					t.Fatalf("context cause %q; want %q", cause, lease.ErrLeaseLost)
				}
				maxPause := time.Duration(done["max_pause"].(float64))
				if tc.tick < 0 {
					t.Logf("lost: %v; done: %v", lost["error"], done["cause"])
					return
				}
				if maxPause < tc.stop-50*time.Millisecond || maxPause > stoppedFor+time.Second {
					t.Fatalf("max pause %s after a %s stop; lost: %v; done: %v", maxPause, stoppedFor, lost, done)
				}
				t.Logf("lost: %v; done: %v", lost["error"], done["cause"])
				return
			}
			p := next(10*time.Second, "lease: keeper: process pause detected")
			pause := time.Duration(p["pause"].(float64))
			left := time.Duration(p["trust_left"].(float64))
			t.Logf("stopped for %s, keeper detected a pause of %s (trust left %s)", stoppedFor, pause, left)
			if pause < tc.stop-50*time.Millisecond || pause > stoppedFor+time.Second {
				t.Fatalf("detected pause %s after a %s stop", pause, stoppedFor)
			}
			// A pause shorter than the trust left does not cost the lease.
			if left <= 0 {
				t.Fatalf("trust left after the pause = %s; want some", left)
			}
		})
	}
}

// readJSONLines decodes the JSON lines of r (skipping the test framework's
// own output) onto a channel, closed at EOF.
func readJSONLines(r io.Reader) <-chan map[string]any {
	ch := make(chan map[string]any, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				ch <- m
			}
		}
	}()
	return ch
}
