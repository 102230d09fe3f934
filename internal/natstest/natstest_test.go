package natstest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/fencegate/fencegate/internal/natstest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	natstest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func publish(t *testing.T, url string) uint64 {
	t.Helper()
	nc := natstest.Connect(t, url)
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "t", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func TestEmbedded(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t)
	if seq := publish(t, s.URL); seq != 1 {
		t.Fatalf("seq %d, want 1", seq)
	}
}

// The process keeps its port and its store across a kill and a restart.
func TestProcessKillRestart(t *testing.T) {
	t.Parallel()
	p := natstest.StartProcess(t)
	if seq := publish(t, p.URL); seq != 1 {
		t.Fatalf("seq %d, want 1", seq)
	}
	p.Kill()
	p.Restart()
	if seq := publish(t, p.URL); seq != 2 {
		t.Fatalf("after restart: seq %d, want 2 (store kept)", seq)
	}
	p.Stop()
}
