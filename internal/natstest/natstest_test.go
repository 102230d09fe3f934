package natstest_test

import (
	"context"
	"os"
	"strconv"
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

// A 3-node cluster keeps an R3 stream available through a killed leader (a
// new one is elected, the restarted node catches up) and a paused follower
// (the other two are a quorum), and its nodes keep their stores.
func TestCluster(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	nc := natstest.Connect(t, c.URLs())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}, Storage: jetstream.FileStorage, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	pub := func(want uint64) {
		t.Helper()
		// Retried: a publish while the leader changes may fail or time out.
		deadline := time.Now().Add(30 * time.Second)
		for {
			ack, err := js.Publish(ctx, "t", []byte("x"), jetstream.WithMsgID(strconv.FormatUint(want, 10)))
			if err == nil {
				if ack.Sequence != want {
					t.Fatalf("seq %d, want %d", ack.Sequence, want)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("publish %d: %v", want, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	pub(1)
	info := c.WaitStream(t, "T", 30*time.Second, "all replicas current", natstest.AllCurrent)
	leader := c.Node(info.Cluster.Leader)
	if leader == nil {
		t.Fatalf("leader %q is not a node", info.Cluster.Leader)
	}
	leader.Kill()
	c.WaitStream(t, "T", 30*time.Second, "a new leader", func(i *jetstream.StreamInfo) bool {
		return i.Cluster != nil && i.Cluster.Leader != "" && i.Cluster.Leader != leader.Name
	})
	pub(2)
	leader.Restart()
	info = c.WaitStream(t, "T", 30*time.Second, "the restarted node current", func(i *jetstream.StreamInfo) bool {
		return natstest.AllCurrent(i) && i.State.LastSeq == 2
	})
	var follower *natstest.Node
	for _, r := range info.Cluster.Replicas {
		follower = c.Node(r.Name)
	}
	follower.Pause()
	pub(3)
	follower.Resume()
	info = c.WaitStream(t, "T", 30*time.Second, "the resumed node current", func(i *jetstream.StreamInfo) bool {
		return natstest.AllCurrent(i) && i.State.Msgs == 3
	})
	t.Logf("after the faults: %s", natstest.DescribeCluster(info))
}
