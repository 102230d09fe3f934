package natstest

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// Two clusters started at once by tests in parallel never merge: a node of
// another cluster whose route reaches one of this cluster's nodes (a port
// that was free when the other cluster chose it, and taken since) is
// refused, because every cluster has a name of its own.
func TestClustersOfTwoTestsNeverMerge(t *testing.T) {
	t.Parallel()
	a := StartCluster(t, 3)
	rogue := &Process{t: t, bin: Binary(t), Port: FreePort(t), StoreDir: t.TempDir()}
	rogue.URL = "nats://127.0.0.1:" + strconv.Itoa(rogue.Port)
	rogue.args = []string{"--server_name", "rogue", "--cluster_name", clusterName(),
		"--cluster", "nats://127.0.0.1:" + strconv.Itoa(FreePort(t)),
		"--routes", "nats://127.0.0.1:" + strconv.Itoa(a.Nodes[0].ClusterPort)}
	t.Cleanup(rogue.Kill)
	rogue.start()
	n1 := a.Nodes[0]
	deadline := time.Now().Add(30 * time.Second)
	for {
		log := n1.logTail() + rogue.logTail()
		switch {
		case strings.Contains(log, "does not match"):
			t.Logf("the other cluster's route was refused: names %q and another", a.Name)
			return
		case strings.Contains(log, "rogue") && strings.Contains(log, "Route connection created"):
			t.Fatalf("a node of another cluster joined %s:\n%s", a.Name, log)
		case time.Now().After(deadline):
			t.Fatalf("no sign of the other cluster's route in 30s:\n%s", log)
		}
		time.Sleep(50 * time.Millisecond) // between polls of the logs
	}
}
