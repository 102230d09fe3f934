package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

type probe struct {
	code   int
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

func getProbe(t *testing.T, addr, path string) probe {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p probe
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	p.code = resp.StatusCode
	return p
}

// Every process answers /healthz and /readyz on its metrics address, an
// adapter-only one too, and /readyz reports each of its parts: ready with
// the dispatcher running and each adapter's consumer there; 503 naming
// nats and the stream when NATS goes away.
func TestProbesOnTheMetricsAddress(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	srv := natstest.Start(t)
	relay, err := Start(context.Background(), Config{Schema: testdb.Schema(), Pool: pool, NATSURL: srv.URL, RunDispatcher: true, MetricsAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Stop()
	p := getProbe(t, relay.MetricsAddr(), "/readyz")
	if p.code != http.StatusOK || p.Checks["dispatcher"] != "running" || p.Checks["postgres"] != "ok" || p.Checks["stream"] != "ok" {
		t.Fatalf("relay /readyz = %d %+v, want 200 with dispatcher running, postgres and stream ok", p.code, p)
	}
	// The admin address answers with the same readiness, every part.
	if a := getProbe(t, relay.AdminAddr(), "/readyz"); a.code != p.code || a.Checks["dispatcher"] != "running" || a.Checks["stream"] != "ok" {
		t.Fatalf("admin /readyz = %d %+v, want the metrics address's %d %+v", a.code, a.Checks, p.code, p.Checks)
	}
	if _, ok := p.Checks["adapters"]; ok {
		t.Fatalf("a relay-only process reports adapters: %+v", p.Checks)
	}

	// An adapter-only process: no admin server, probes all the same.
	worker, err := Start(context.Background(), Config{Schema: testdb.Schema(), Pool: pool, NATSURL: srv.URL,
		Adapters: []adapters.Registration{fileRegistration(t, nil)}, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Stop()
	if h := getProbe(t, worker.MetricsAddr(), "/healthz"); h.code != http.StatusOK || h.Status != "ok" {
		t.Fatalf("/healthz = %d %+v", h.code, h)
	}
	p = getProbe(t, worker.MetricsAddr(), "/readyz")
	if p.code != http.StatusOK || p.Status != "ready" || p.Checks["adapter:file"] != "consuming" || p.Checks["adapters"] != "running" {
		t.Fatalf("adapter /readyz = %d %+v, want 200 with adapter:file consuming", p.code, p)
	}
	if _, ok := p.Checks["dispatcher"]; ok {
		t.Fatalf("an adapter-only process reports a dispatcher: %+v", p.Checks)
	}

	srv.Shutdown()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p = getProbe(t, worker.MetricsAddr(), "/readyz")
		// The stream check may fail first (its request times out) while
		// the client has not yet noticed the lost connection: wait for
		// both, as a probe a little later sees them.
		if p.code == http.StatusServiceUnavailable && p.Checks["nats"] != "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d %+v with NATS down, want 503 naming nats", p.code, p)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p.Status != "unavailable" || p.Checks["nats"] == "ok" || p.Checks["postgres"] != "ok" {
		t.Fatalf("with NATS down: %+v, want unavailable naming nats, postgres ok", p)
	}
	if h := getProbe(t, worker.MetricsAddr(), "/healthz"); h.code != http.StatusOK {
		t.Fatalf("/healthz with NATS down = %d, want 200 (alive)", h.code)
	}
	// The admin address (no token, maybe behind an ingress) says which
	// check failed, not the error behind it; the metrics address does.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		p = getProbe(t, relay.MetricsAddr(), "/readyz")
		if p.code == http.StatusServiceUnavailable && strings.HasPrefix(p.Checks["nats"], "unavailable: ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay /readyz still %d %+v with NATS down, want 503 naming nats with its state", p.code, p)
		}
	}
	a := getProbe(t, relay.AdminAddr(), "/readyz")
	if a.code != http.StatusServiceUnavailable || a.Status != "unavailable" || a.Checks["nats"] != "unavailable" {
		t.Fatalf("admin /readyz with NATS down = %d %+v, want 503 naming nats", a.code, a)
	}
	for name, v := range a.Checks {
		if strings.Contains(v, ":") {
			t.Errorf("admin /readyz check %s = %q: the error's text on the admin address", name, v)
		}
	}
}
