package natstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is a JetStream cluster of nats-server processes on 127.0.0.1,
// fully meshed by routes, each node with its own ports and store directory
// that survive Kill and Restart.
type Cluster struct {
	// Name is the cluster's name (--cluster_name).
	Name  string
	Nodes []*Node
}

// Node is one server of a Cluster.
type Node struct {
	*Process
	// Name is the server's name (--server_name), the name stream and
	// consumer info report for leaders and replicas.
	Name string
	// ClusterPort takes the routes of the other nodes.
	ClusterPort int
	// MonitorURL is the HTTP monitoring endpoint, http://127.0.0.1:PORT
	// (/varz, /connz, /jsz).
	MonitorURL string
}

// StartCluster starts an n-node JetStream cluster (n >= 3 for a quorum that
// survives a node) and waits until JetStream is served with a meta leader
// elected. The nodes are killed when the test ends.
//
// A node that exits during start-up (a port FreePort found free was taken
// meanwhile: another test's listener or outgoing connection, on a busy
// machine) makes it start the whole cluster again on new ports, up to three
// times.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: StartCluster needs at least one node, got %d", n)
	}
	bin := Binary(t)
	const tries = 3
	for try := 1; ; try++ {
		c, err := startCluster(t, bin, n)
		if err == nil {
			return c
		}
		for _, node := range c.Nodes {
			node.Kill()
		}
		if try == tries || !errors.Is(err, errExited) {
			t.Fatalf("natstest: %v", err)
		}
		t.Logf("natstest: starting the cluster again on other ports: %v", err)
	}
}

func startCluster(t testing.TB, bin string, n int) (*Cluster, error) {
	c := &Cluster{Name: clusterName()}
	routes := make([]string, n)
	for i := range n {
		node := &Node{
			Process:     &Process{t: t, bin: bin, Port: FreePort(t), StoreDir: t.TempDir()},
			Name:        "n" + strconv.Itoa(i+1),
			ClusterPort: FreePort(t),
		}
		node.URL = "nats://127.0.0.1:" + strconv.Itoa(node.Port)
		node.MonitorURL = "http://127.0.0.1:" + strconv.Itoa(FreePort(t))
		routes[i] = "nats://127.0.0.1:" + strconv.Itoa(node.ClusterPort)
		c.Nodes = append(c.Nodes, node)
	}
	for _, node := range c.Nodes {
		node.args = []string{
			"--server_name", node.Name,
			"--cluster_name", c.Name,
			"--cluster", "nats://127.0.0.1:" + strconv.Itoa(node.ClusterPort),
			// Every node lists every route, itself included (the server
			// skips it): the mesh forms whatever order they start in.
			"--routes", strings.Join(routes, ","),
			"-m", strings.TrimPrefix(node.MonitorURL, "http://127.0.0.1:"),
		}
		t.Cleanup(node.Kill)
	}
	// All nodes start before any is waited for: JetStream is served only
	// once a quorum has elected a meta leader.
	exited := make([]<-chan struct{}, n)
	for i, node := range c.Nodes {
		exited[i] = node.start()
	}
	// Any node exiting during start-up (a port taken since FreePort chose
	// it) restarts the cluster, whichever node is being waited for: its
	// peers would otherwise wait the whole timeout for a quorum.
	anyExited := make(chan struct{})
	var once sync.Once
	for _, ch := range exited {
		go func() {
			<-ch
			once.Do(func() { close(anyExited) })
		}()
	}
	for _, node := range c.Nodes {
		if err := node.waitJetStream(anyExited, startTimeout); err != nil {
			return c, fmt.Errorf("cluster node %s on port %d: %w", node.Name, node.Port, err)
		}
	}
	return c, nil
}

// clusterName is a cluster's own name. Every cluster a test starts has its
// own: nodes of two clusters started at once by tests in parallel (the
// packages' test binaries run side by side) refuse each other's routes
// when their names differ, and with one shared name they merged whenever
// one cluster's route reached the other's port (a port FreePort chose,
// then taken by the other cluster before this one bound it), and the
// merged meta group then served no JetStream for the whole start timeout.
func clusterName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "fencegate-test-" + hex.EncodeToString(b)
}

// URLs returns the client URLs of all nodes, comma-separated: the seed list
// a client is given (nats.Connect and --nats-url take it as is).
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.Nodes))
	for i, node := range c.Nodes {
		urls[i] = node.URL
	}
	return strings.Join(urls, ",")
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, node := range c.Nodes {
		if node.Name == name {
			return node
		}
	}
	return nil
}

// liveURLs returns the client URLs of the nodes running and not paused.
func (c *Cluster) liveURLs() string {
	var urls []string
	for _, node := range c.Nodes {
		if node.Running() && !node.Paused() {
			urls = append(urls, node.URL)
		}
	}
	return strings.Join(urls, ",")
}

// StreamInfo asks the cluster (any live node) for stream's info, bounded by
// timeout. The answer comes from the stream's leader: an error while there
// is none.
func (c *Cluster) StreamInfo(stream string, timeout time.Duration) (*jetstream.StreamInfo, error) {
	return ask(c, timeout, func(ctx context.Context, js jetstream.JetStream) (*jetstream.StreamInfo, error) {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return nil, err
		}
		return s.CachedInfo(), nil
	})
}

// ask calls f with JetStream on a new connection to the live nodes and a
// context bounded by timeout, and closes the connection after it.
func ask[T any](c *Cluster, timeout time.Duration, f func(context.Context, jetstream.JetStream) (T, error)) (T, error) {
	nc, js, err := c.dial()
	if err != nil {
		var zero T
		return zero, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return f(ctx, js)
}

// WaitStream polls the stream's info until ok accepts it or timeout passes,
// and returns the info ok accepted. ok nil: any answer (a leader is
// elected).
func (c *Cluster) WaitStream(t testing.TB, stream string, timeout time.Duration, what string, ok func(*jetstream.StreamInfo) bool) *jetstream.StreamInfo {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		info, err := c.StreamInfo(stream, 2*time.Second)
		switch {
		case err != nil:
			last = err.Error()
		case ok == nil || ok(info):
			return info
		default:
			last = DescribeCluster(info)
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: stream %s: %s not reached in %s (last: %s)", stream, what, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AllCurrent reports whether info shows a leader and every replica current
// (caught up with the leader) and online.
func AllCurrent(info *jetstream.StreamInfo) bool {
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return false
	}
	for _, r := range info.Cluster.Replicas {
		if !r.Current || r.Offline {
			return false
		}
	}
	return true
}

// DescribeCluster says who leads the stream and how its replicas are.
func DescribeCluster(info *jetstream.StreamInfo) string {
	if info == nil || info.Cluster == nil {
		return "no cluster info"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "leader %q", info.Cluster.Leader)
	for _, r := range info.Cluster.Replicas {
		fmt.Fprintf(&b, ", %s current=%t offline=%t lag=%d active=%s", r.Name, r.Current, r.Offline, r.Lag, r.Active.Round(time.Millisecond))
	}
	return b.String()
}

// Clients returns how many client connections named name (nats.Name) the
// node serves, from its monitoring endpoint (/connz). A paused node does
// not answer: ask only live ones.
func (n *Node) Clients(name string) (int, error) {
	hc := &http.Client{Timeout: 2 * time.Second}
	res, err := hc.Get(n.MonitorURL + "/connz?limit=4096")
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("node %s: /connz: %s", n.Name, res.Status)
	}
	var connz struct {
		Connections []struct {
			Name string `json:"name"`
		} `json:"connections"`
	}
	if err := json.NewDecoder(res.Body).Decode(&connz); err != nil {
		return 0, fmt.Errorf("node %s: /connz: %w", n.Name, err)
	}
	count := 0
	for _, c := range connz.Connections {
		if c.Name == name {
			count++
		}
	}
	return count, nil
}

// MoveStreamLeader asks the stream's leader to step down in favour of node
// (a stepdown with a preferred placement) and polls until node leads,
// retrying the request while it is refused (node not caught up yet) until
// timeout passes.
func (c *Cluster) MoveStreamLeader(stream string, node *Node, timeout time.Duration) error {
	return c.moveLeader("stream "+stream, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, node, timeout, func() (string, error) {
		info, err := c.StreamInfo(stream, 2*time.Second)
		if err != nil {
			return "", err
		}
		if info.Cluster == nil {
			return "", nil
		}
		return info.Cluster.Leader, nil
	})
}

// MoveConsumerLeader is MoveStreamLeader for a consumer of stream.
func (c *Cluster) MoveConsumerLeader(stream, consumer string, node *Node, timeout time.Duration) error {
	return c.moveLeader("consumer "+consumer, "$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+consumer, node, timeout, func() (string, error) {
		info, err := c.ConsumerInfo(stream, consumer, 2*time.Second)
		if err != nil {
			return "", err
		}
		if info.Cluster == nil {
			return "", nil
		}
		return info.Cluster.Leader, nil
	})
}

// ConsumerInfo asks the cluster (any live node) for a consumer's info,
// bounded by timeout: an error while the consumer has no leader.
func (c *Cluster) ConsumerInfo(stream, consumer string, timeout time.Duration) (*jetstream.ConsumerInfo, error) {
	return ask(c, timeout, func(ctx context.Context, js jetstream.JetStream) (*jetstream.ConsumerInfo, error) {
		cons, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return nil, err
		}
		return cons.CachedInfo(), nil
	})
}

func (c *Cluster) moveLeader(what, subject string, node *Node, timeout time.Duration, leader func() (string, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		l, err := leader()
		if err == nil && l == node.Name {
			return nil
		}
		if err != nil {
			last = err
		} else {
			last = c.stepDown(subject, node.Name)
		}
		time.Sleep(200 * time.Millisecond) // between tries: an election takes a moment
	}
	return fmt.Errorf("%s: %s does not lead after %s (last: %v)", what, node.Name, timeout, last)
}

// dial connects, without reconnecting, to the live nodes (the one that
// answers first), for one request; the caller closes nc.
func (c *Cluster) dial() (*nats.Conn, jetstream.JetStream, error) {
	urls := c.liveURLs()
	if urls == "" {
		return nil, nil, errors.New("no live node")
	}
	nc, err := nats.Connect(urls, nats.Timeout(time.Second), nats.NoReconnect())
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// stepDown sends a leader stepdown request (stream, consumer) to subject
// with preferred as the placement.
func (c *Cluster) stepDown(subject, preferred string) error {
	nc, _, err := c.dial()
	if err != nil {
		return err
	}
	defer nc.Close()
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": preferred}})
	msg, err := nc.Request(subject, req, 2*time.Second)
	if err != nil {
		return err
	}
	var res struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &res); err != nil {
		return err
	}
	if res.Error != nil {
		return errors.New(res.Error.Description)
	}
	return nil
}
