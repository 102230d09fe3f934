package natstest_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/fencegate/fencegate/internal/testkit/natstest"
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

// A 3-node cluster keeps an R3 stream available through a killed leader (a
// new one is elected, the restarted node catches up) and a paused follower
// (the other two are a quorum), and its nodes keep their stores.
//
// Every step has its own deadline, generous for a loaded 2-core machine
// (the whole suite runs alongside in CI); one shared deadline let a slow
// early step starve the later ones.
func TestCluster(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	// A short ping interval: a client on a paused node (its socket open,
	// nothing answered) finds out within a few seconds and moves to a live
	// one; with nats.go's default (2 minutes, 2 outstanding) it would wait
	// there for minutes.
	nc := natstest.Connect(t, c.URLs(), nats.PingInterval(500*time.Millisecond), nats.MaxPingsOutstanding(2),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const step = 90 * time.Second
	// retry repeats op, each try bounded, until it succeeds or the step's
	// deadline passes: a request while a leader is being elected fails or
	// times out, and is answered once one is.
	retry := func(what string, op func(ctx context.Context) error) {
		t.Helper()
		deadline := time.Now().Add(step)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := op(ctx)
			cancel()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: still failing after %s: %v", what, step, err)
			}
			time.Sleep(100 * time.Millisecond) // between tries, not a synchronisation
		}
	}
	retry("create the R3 stream", func(ctx context.Context) error {
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}, Storage: jetstream.FileStorage, Replicas: 3})
		return err
	})
	pub := func(want uint64) {
		t.Helper()
		// The message id makes a retry after a lost PubAck a duplicate,
		// answered with the first one's sequence.
		retry("publish "+strconv.FormatUint(want, 10), func(ctx context.Context) error {
			ack, err := js.Publish(ctx, "t", []byte("x"), jetstream.WithMsgID(strconv.FormatUint(want, 10)))
			if err == nil && ack.Sequence != want {
				t.Fatalf("seq %d, want %d", ack.Sequence, want)
			}
			return err
		})
	}
	pub(1)
	info := c.WaitStream(t, "T", step, "all replicas current", natstest.AllCurrent)
	leader := c.Node(info.Cluster.Leader)
	if leader == nil {
		t.Fatalf("leader %q is not a node", info.Cluster.Leader)
	}
	leader.Kill()
	c.WaitStream(t, "T", step, "a new leader", func(i *jetstream.StreamInfo) bool {
		return i.Cluster != nil && i.Cluster.Leader != "" && i.Cluster.Leader != leader.Name
	})
	pub(2)
	leader.Restart()
	info = c.WaitStream(t, "T", step, "the restarted node current", func(i *jetstream.StreamInfo) bool {
		return natstest.AllCurrent(i) && i.State.LastSeq == 2
	})
	var follower *natstest.Node
	for _, r := range info.Cluster.Replicas {
		follower = c.Node(r.Name)
	}
	follower.Pause()
	pub(3)
	follower.Resume()
	info = c.WaitStream(t, "T", step, "the resumed node current", func(i *jetstream.StreamInfo) bool {
		return natstest.AllCurrent(i) && i.State.Msgs == 3
	})
	t.Logf("after the faults: %s", natstest.DescribeCluster(info))
}
