package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencegate/fencegate/internal/errmap"
)

// probeTimeout bounds each /readyz check that leaves the process.
const probeTimeout = 2 * time.Second

// consumer is one adapter kind the runtime consumes and its durable.
type consumer struct{ kind, durable string }

func writeProbe(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// healthz answers while the process serves: liveness, nothing more.
func (s *Gateway) healthz(w http.ResponseWriter, _ *http.Request) {
	writeProbe(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is 200 {"status":"ready","checks":{…}} when every part this
// process runs is in working order, else 503 "unavailable" naming the
// check that is not: postgres (a ping), nats (the connection's state),
// stream (JetStream answers for the intents stream), dispatcher (running),
// and adapter:<kind> per adapter (the runtime running and its durable
// consumer present). A part still starting is "starting" (503).
func (s *Gateway) readyz(w http.ResponseWriter, r *http.Request) {
	s.writeReadiness(w, r, true)
}

// adminReadyz is readyz for the admin address, which answers it without a
// token and may face other networks (an ingress): the same checks, but a
// failed one says only "unavailable", never the error behind it (a
// PostgreSQL error names the host, port, user and database). The metrics
// address, loopback or firewalled, keeps the detail.
func (s *Gateway) adminReadyz(w http.ResponseWriter, r *http.Request) {
	s.writeReadiness(w, r, false)
}

func (s *Gateway) writeReadiness(w http.ResponseWriter, r *http.Request, detail bool) {
	s.mu.Lock()
	d, rt, consumers := s.dispatcher, s.runtime, s.consumers
	started := s.startDone
	s.mu.Unlock()
	cfg := s.cfg
	checks := map[string]string{}
	ok := true
	fail := func(name, msg string) {
		ok = false
		checks[name] = msg
	}
	ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
	defer cancel()
	if err := cfg.Pool.Ping(ctx); err != nil {
		fail("postgres", "unavailable: "+errmap.OneLine(err.Error()))
	} else {
		checks["postgres"] = "ok"
	}
	nc := s.nc
	if nc == nil || nc.Status() != nats.CONNECTED {
		state := "not connected"
		if nc != nil {
			state = nc.Status().String()
		}
		fail("nats", "unavailable: "+state)
	} else {
		checks["nats"] = "ok"
	}
	var stream jetstream.Stream
	if checks["nats"] == "ok" {
		js, err := jetstream.New(nc)
		if err == nil {
			stream, err = js.Stream(ctx, s.ns.Stream())
		}
		if err != nil {
			fail("stream", "unavailable: "+errmap.OneLine(err.Error()))
		} else {
			checks["stream"] = "ok"
		}
	}
	if cfg.runsDispatcher() {
		switch {
		case d == nil:
			fail("dispatcher", state(started))
		case isClosed(d.Stopped()):
			fail("dispatcher", "stopped")
		default:
			checks["dispatcher"] = "running"
		}
	}
	if cfg.runsAdapters() {
		switch {
		case rt == nil:
			fail("adapters", state(started))
		case isClosed(rt.Stopped()):
			fail("adapters", "stopped")
		default:
			checks["adapters"] = "running"
			for _, c := range consumers {
				name := "adapter:" + c.kind
				if stream == nil {
					fail(name, "unavailable: no stream")
					continue
				}
				if _, err := stream.Consumer(ctx, c.durable); err != nil {
					fail(name, "unavailable: consumer "+c.durable+": "+errmap.OneLine(err.Error()))
					continue
				}
				checks[name] = "consuming"
			}
		}
	}
	code, status := http.StatusOK, "ready"
	if !ok {
		code, status = http.StatusServiceUnavailable, "unavailable"
	}
	if !detail {
		for name, v := range checks {
			if strings.HasPrefix(v, "unavailable") {
				checks[name] = "unavailable"
			}
		}
	}
	writeProbe(w, code, map[string]any{"status": status, "checks": checks})
}

// state is what a part not yet there is: still starting, or never
// started (Start failed or stopped first).
func state(startDone bool) string {
	if startDone {
		return "stopped"
	}
	return "starting"
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
