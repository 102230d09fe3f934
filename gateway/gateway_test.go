package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/internal/natstest"
	"github.com/fencegate/fencegate/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Start, in process as `gateway dev` uses it: every part starts, the
// metrics server serves the dispatcher's and the adapters' metrics, and Stop
// stops everything without Stopped reporting a death.
func TestStart(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	srv := natstest.Start(t)
	s, err := Start(context.Background(), Config{
		Pool: pool, NATSURL: srv.URL, RunDispatcher: true,
		Adapters:    []string{file.Kind},
		File:        file.Config{Root: t.TempDir()},
		MetricsAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.dispatcher == nil || s.runtime == nil || s.file == nil || s.email != nil || s.sweeper == nil {
		t.Fatalf("parts: dispatcher %v runtime %v file %v email %v sweeper %v", s.dispatcher, s.runtime, s.file, s.email, s.sweeper)
	}
	resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// (The adapters' metrics are vectors: they show once something ran.)
	for _, m := range []string{"claimed_total", "go_goroutines"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	s.Stop()
	s.Stop() // idempotent
	select {
	case <-s.Stopped():
		t.Fatalf("Stopped closed by Stop (cause %q)", s.Cause())
	default:
	}

	if _, err := Start(context.Background(), Config{Pool: pool, NATSURL: srv.URL}); err == nil {
		t.Fatal("a stack with nothing to run started")
	}
}
