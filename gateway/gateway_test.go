package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Start, in process as `gateway dev` uses it: every part starts, the
// metrics server serves the dispatcher's and the adapters' metrics, and Stop
// stops everything without Stopped reporting a death.
func TestStart(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	srv := natstest.Start(t)
	s, err := Start(context.Background(), Config{Schema: testdb.Schema(),
		Pool: pool, NATSURL: srv.URL, Dispatcher: &dispatcher.Config{},
		Adapters:    []adapters.Registration{fileRegistration(t, nil)},
		MetricsAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.dispatcher == nil || s.runtime == nil || s.sweeper == nil || len(s.consumers) != 1 || s.consumers[0].kind != file.Kind {
		t.Fatalf("parts: dispatcher %v runtime %v sweeper %v consumers %v", s.dispatcher, s.runtime, s.sweeper, s.consumers)
	}
	resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// (The adapters' metrics are vectors: they show once something ran.)
	for _, m := range []string{"claimed_total", "go_goroutines", "fencegate_build_info{"} {
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

	if _, err := Start(context.Background(), Config{Schema: testdb.Schema(), Pool: pool, NATSURL: srv.URL}); err == nil {
		t.Fatal("a stack with nothing to run started")
	}
}

// fileRegistration is the file adapter under a root of the test's own,
// its metrics on reg (nil: none).
func fileRegistration(t *testing.T, reg prometheus.Registerer) adapters.Registration {
	t.Helper()
	f, err := file.New(file.Config{Root: t.TempDir(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return f.Registration()
}

// ownKind is a program's own kind for the tests: its executor counts
// executions.
type ownKind struct {
	mu   sync.Mutex
	runs map[int64]int
}

func (k *ownKind) Kind() string                        { return "notify" }
func (k *ownKind) Capabilities() adapters.Capabilities { return adapters.Capabilities{} }
func (k *ownKind) Execute(_ context.Context, req adapters.Request) (adapters.Outcome, error) {
	k.mu.Lock()
	k.runs[req.IntentID]++
	k.mu.Unlock()
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: json.RawMessage(`{"sent":true}`)}, nil
}

// A kind registered by the program (one registration in Config.Adapters)
// is accepted by the HTTP intake with its payload rules,
// executed by the runtime, and offered on the admin pages.
func TestOwnKindThroughIntakeAndPages(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	srv := natstest.Start(t)
	own := &ownKind{runs: map[int64]int{}}
	spec := outbox.KindSpec{DefaultFence: outbox.FenceCommit, Validate: func(p map[string]any) error {
		if s, _ := p["channel"].(string); s == "" {
			return &outbox.ValidationError{Field: "payload.channel", Message: "must not be empty"}
		}
		return nil
	}}
	g, err := Start(context.Background(), Config{Schema: testdb.Schema(),
		Pool: pool, NATSURL: srv.URL, Dispatcher: &dispatcher.Config{},
		Adapters:    []adapters.Registration{{Kind: "notify", Spec: spec, Executor: own}},
		Idempotency: idempotency.Config{Schema: testdb.Schema(), GroupCommit: true},
		AdminAddr:   "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	api := "http://" + g.AdminAddr() + "/api/v1"
	post := func(path, body string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(api+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	code, l := post("/leases", `{"resource":"r","holder":"w","ttl_ms":60000}`)
	if code != http.StatusCreated {
		t.Fatalf("acquire: %d %v", code, l)
	}
	epoch := int64(l["epoch"].(float64))
	code, bad := post("/intents", fmt.Sprintf(`{"resource":"r","epoch":%d,"operation_id":"n-0","kind":"notify","payload":{"text":"x"}}`, epoch))
	if e, _ := bad["error"].(map[string]any); code != http.StatusBadRequest || e["field"] != "payload.channel" {
		t.Fatalf("bad payload: %d %v, want 400 naming payload.channel", code, bad)
	}
	code, in := post("/intents", fmt.Sprintf(`{"resource":"r","epoch":%d,"operation_id":"n-1","kind":"notify","payload":{"channel":"ops"}}`, epoch))
	if code != http.StatusCreated {
		t.Fatalf("enqueue: %d %v", code, in)
	}
	id := int64(in["intent_id"].(float64))
	deadline := time.Now().Add(time.Minute)
	for {
		rec, err := g.Outbox().Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status == outbox.StatusSucceeded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("intent %d still %s", id, rec.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	own.mu.Lock()
	n := own.runs[id]
	own.mu.Unlock()
	if n != 1 {
		t.Fatalf("executed %d times, want 1", n)
	}
	resp, err := http.Get("http://" + g.AdminAddr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), ">notify<") {
		t.Fatalf("the intents page does not offer kind notify:\n%.2000s", page)
	}
}

// New connects to nothing and checks the configuration; Start runs what
// it built, once: a second Start, or a Start after Stop, is an error, and a
// NATS connection the caller gave is not closed by Stop.
func TestNewStartOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	srv := natstest.Start(t)
	own := &ownKind{runs: map[int64]int{}}
	spec := outbox.KindSpec{DefaultFence: outbox.FenceCommit}
	for name, regs := range map[string][]adapters.Registration{
		"no kind":             {{Spec: spec, Executor: own}},
		"kind twice":          {{Kind: "notify", Spec: spec, Executor: own}, {Kind: "notify", Spec: spec}},
		"no spec":             {{Kind: "notify", Executor: own}},
		"another kind's exec": {{Kind: "sms", Spec: spec, Executor: own}},
		"kind not a token":    {{Kind: "a b", Spec: spec}},
		"kind with a dot":     {{Kind: "x.y", Spec: spec}},
	} {
		_, err := New(pool, nil, Config{Schema: testdb.Schema(), Dispatcher: &dispatcher.Config{}, Adapters: regs})
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || !strings.HasPrefix(inv.Field, "Adapters[") || errmap.Map(err).Code != errmap.InvalidInput {
			t.Errorf("%s: New = %v, want bad input naming Adapters[i]", name, err)
		}
	}
	// No pool: bad input naming Pool (it was a plain error), by New and
	// Start.
	if _, err := New(nil, nil, Config{Schema: testdb.Schema(), Dispatcher: &dispatcher.Config{}}); !isInvalid(err, "Pool") {
		t.Fatalf("New with no pool = %v, want an InvalidError naming Pool", err)
	}
	if _, err := Start(context.Background(), Config{Schema: testdb.Schema(), Dispatcher: &dispatcher.Config{}}); !isInvalid(err, "Pool") {
		t.Fatalf("Start with no pool = %v, want an InvalidError naming Pool", err)
	}
	// A schema fencegate was never migrated into: the Schema is what is
	// wrong, not the Pool (it named Pool).
	if _, err := Start(context.Background(), Config{Pool: pool, Schema: "nosuchschema", Dispatcher: &dispatcher.Config{}}); !isInvalid(err, "Schema") ||
		!strings.Contains(err.Error(), `"nosuchschema" is not migrated`) {
		t.Fatalf("Start with an unmigrated Schema = %v, want an InvalidError naming Schema", err)
	}
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	g, err := New(pool, nc, Config{Schema: testdb.Schema(), Dispatcher: &dispatcher.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	if g.Dispatcher() != nil {
		t.Fatal("New started the dispatcher")
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if g.Dispatcher() == nil || g.NATS() != nc {
		t.Fatalf("after Start: dispatcher %v, NATS %v (want the given connection)", g.Dispatcher(), g.NATS())
	}
	if err := g.Start(context.Background()); !errors.Is(err, startstop.ErrStarted) {
		t.Fatalf("second Start: %v, want ErrStarted", err)
	}
	g.Stop()
	if nc.IsClosed() {
		t.Fatal("Stop closed the caller's NATS connection")
	}
	g2, err := New(pool, nc, Config{Schema: testdb.Schema(), Dispatcher: &dispatcher.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	g2.Stop()
	g2.Stop()
	if err := g2.Start(context.Background()); !errors.Is(err, startstop.ErrStoppedBeforeStart) {
		t.Fatalf("Start after Stop: %v, want ErrStoppedBeforeStart", err)
	}
}

// A registration's probe runs once at start, before anything is consumed:
// its failure stops the start (bad input when the probe says so, else the
// destination unavailable, naming the kind), and a registration without
// an executor is a kind of the intake only, consumed by no runtime here.
func TestAdapterProbeAndIntakeOnlyKind(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	srv := natstest.Start(t)
	spec := outbox.KindSpec{DefaultFence: outbox.FenceCommit}
	for _, tc := range []struct {
		probeErr error
		code     errmap.Code
		message  string
	}{
		{errors.New("the destination ignores conditions"), errmap.Unavailable, "notify: the destination ignores conditions"},
		{errmap.Invalid("notify_endpoint", "--notify-endpoint: no such bucket"), errmap.InvalidInput, "--notify-endpoint: no such bucket"},
	} {
		probes := 0
		own := &ownKind{runs: map[int64]int{}}
		_, err := Start(context.Background(), Config{Schema: testdb.Schema(), Pool: pool, NATSURL: srv.URL, Dispatcher: &dispatcher.Config{},
			Adapters: []adapters.Registration{{Kind: "notify", Spec: spec, Executor: own,
				Probe: func(context.Context) error { probes++; return tc.probeErr }}}})
		var e *errmap.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.message {
			t.Fatalf("Start with a failing probe = %v, want %s %q", err, tc.code, tc.message)
		}
		if probes != 1 {
			t.Fatalf("the probe ran %d times, want once", probes)
		}
	}

	g, err := Start(context.Background(), Config{Schema: testdb.Schema(), Pool: pool, NATSURL: srv.URL, Dispatcher: &dispatcher.Config{},
		Adapters: []adapters.Registration{{Kind: "notify", Spec: spec}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	if g.Runtime() != nil {
		t.Fatal("a registration without an executor started the adapter runtime")
	}
	if !slices.Contains(g.Outbox().Kinds(), "notify") || !slices.Contains(g.Outbox().Kinds(), file.Kind) {
		t.Fatalf("the intake's kinds %v lack notify or the built-in ones", g.Outbox().Kinds())
	}
}

// isInvalid reports whether err is a *fenceerr.InvalidError naming field.
func isInvalid(err error, field string) bool {
	var inv *fenceerr.InvalidError
	return errors.As(err, &inv) && inv.Field == field
}
