package natstest

import (
	"encoding/json"
	"net/http"
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
	// A join shows in n1's routes (/routez lists a route once its
	// handshake passed, with the remote's server name); a refusal shows in
	// the logs. The log lines alone cannot tell a join: "Route connection
	// created" is logged for every route before its cluster name is
	// checked, and for n1's own peers.
	joined := func() bool {
		res, err := http.Get(n1.MonitorURL + "/routez")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var rz struct {
			Routes []struct {
				RemoteName string `json:"remote_name"`
			} `json:"routes"`
		}
		if err := json.NewDecoder(res.Body).Decode(&rz); err != nil {
			t.Fatal(err)
		}
		for _, r := range rz.Routes {
			if r.RemoteName == "rogue" {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		log := n1.logTail() + rogue.logTail()
		switch {
		case joined():
			t.Fatalf("a node of another cluster joined %s:\n%s", a.Name, log)
		case strings.Contains(log, "does not match"):
			if joined() {
				t.Fatalf("a node of another cluster joined %s after a refusal:\n%s", a.Name, log)
			}
			t.Logf("the other cluster's route was refused: names %q and another", a.Name)
			return
		case time.Now().After(deadline):
			t.Fatalf("no sign of the other cluster's route in 30s:\n%s", log)
		}
		time.Sleep(50 * time.Millisecond) // between polls of the logs
	}
}
