// Package cluster holds the NATS cluster fault test: fencegate's
// production layout (a 3-node JetStream cluster, the stream on 3 replicas,
// two relay processes and two adapter processes given every seed URL) under
// a steady load while nodes are killed, restarted, paused and resumed, as
// real processes against a real PostgreSQL and a real HTTP destination.
//
// Its short form runs in `make test`; FENCEGATE_CLUSTER_LONG=1 (`make
// cluster`, part of `make chaos`) runs the long form: more rounds of
// faults, a higher rate, longer pauses.
package cluster

import (
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/faulttest"
)

func TestMain(m *testing.M) { faulttest.Main(m) }
