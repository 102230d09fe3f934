package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/internal/deployment"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/faulttest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// The NATS permissions docs/operations.md gives each role of gateway run
// ("NATS users for gateway run") are enough and each of them is needed:
// a nats-server configured with the documented block, users
// fencegate-relay and fencegate-adapters, carries a relay-only and an
// adapter-only process (two kinds) that relay and execute intents end to
// end, both ready, no violation logged; a process running both parts as a
// user with both lists does too. Then each line of each user is removed
// in turn, and the process of that user must log the permissions
// violation naming the subject (not wait in silence).
func TestNATSPermissionsPerRole(t *testing.T) {
	t.Parallel()
	// checked counts what was checked, want what the subtests that ran
	// meant to check: 6 end to end, 1 per missing permission.
	var checked, want atomic.Int64
	t.Run("documented", func(t *testing.T) {
		t.Parallel()
		want.Add(6)
		pool := testdb.New(t)
		ns := namespaceOf(t, pool)
		kinds := []string{file.Kind, "notify"}
		users := documentedNATSUsers(t, ns, kinds)
		relayUser, adaptersUser := users["fencegate-relay"], users["fencegate-adapters"]
		srv := natstest.StartWith(t, func(o *server.Options) { o.Users = []*server.User{relayUser, adaptersUser} })

		var relayLog, adaptersLog faulttest.SyncBuffer
		// The relay serves the intake of kind notify (no executor).
		notify := adapters.Registration{Kind: "notify", Spec: outbox.KindSpec{DefaultFence: outbox.FenceCommit}}
		relay := startAs(t, srv.URL, relayUser, Config{Pool: pool, Dispatcher: &dispatcher.Config{},
			Adapters: []adapters.Registration{notify}}, &relayLog)
		own := &ownKind{runs: map[int64]int{}}
		notify.Executor = own
		workers := startAs(t, srv.URL, adaptersUser, Config{Pool: pool,
			Adapters: []adapters.Registration{fileRegistration(t, nil), notify}}, &adaptersLog)
		for _, id := range []int64{
			enqueue(t, pool, relay, "perm-file", file.Kind, `{"target":"a.txt","content":"x"}`),
			enqueue(t, pool, relay, "perm-notify", "notify", `{"channel":"ops"}`),
		} {
			waitSucceeded(t, relay, id)
			checked.Add(1)
		}
		own.mu.Lock()
		n := maps.Clone(own.runs)
		own.mu.Unlock()
		if len(n) != 1 || slices.Collect(maps.Values(n))[0] != 1 {
			t.Fatalf("the notify adapter executed %v (intent id: times), want one intent once", n)
		}
		waitReady(t, relay, "relay")
		waitReady(t, workers, "adapters")
		checked.Add(2)
		for name, l := range map[string]*faulttest.SyncBuffer{"relay": &relayLog, "adapters": &adaptersLog} {
			if strings.Contains(l.String(), "Permissions Violation") {
				t.Errorf("%s logged a permissions violation with the documented permissions:\n%s", name, l.String())
			}
		}

		// Both parts in one process (gateway run's default), in a
		// database of its own: a user with both lists.
		pool2 := testdb.New(t)
		both := union(documentedNATSUsers(t, namespaceOf(t, pool2), []string{file.Kind}))
		srv2 := natstest.StartWith(t, func(o *server.Options) { o.Users = []*server.User{both} })
		var bothLog faulttest.SyncBuffer
		g := startAs(t, srv2.URL, both, Config{Pool: pool2, Dispatcher: &dispatcher.Config{},
			Adapters: []adapters.Registration{fileRegistration(t, nil)}}, &bothLog)
		waitSucceeded(t, g, enqueue(t, pool2, g, "perm-both", file.Kind, `{"target":"b.txt","content":"y"}`))
		waitReady(t, g, "relay and adapters")
		checked.Add(2)
		if strings.Contains(bothLog.String(), "Permissions Violation") {
			t.Errorf("a process running both logged a permissions violation with both lists:\n%s", bothLog.String())
		}
	})

	// Each line removed in turn. Listed from the documented block of a
	// throwaway namespace, to name the subtests; each runs in a database
	// (a namespace) of its own.
	for _, role := range []string{"fencegate-relay", "fencegate-adapters"} {
		u := documentedNATSUsers(t, "x", []string{file.Kind})[role]
		for _, dir := range []string{"publish", "subscribe"} {
			for i, subject := range permsOf(u, dir).Allow {
				t.Run(fmt.Sprintf("%s without %s %s", role, dir, subject), func(t *testing.T) {
					t.Parallel()
					want.Add(1)
					missingPermissionIsSaid(t, role, dir, i)
					checked.Add(1)
				})
			}
		}
	}
	t.Cleanup(func() {
		t.Logf("checked %d: intents relayed and executed, processes ready, missing permissions said", checked.Load())
		if !t.Failed() && (checked.Load() == 0 || checked.Load() != want.Load()) {
			t.Errorf("checked %d things, want %d (and more than none)", checked.Load(), want.Load())
		}
	})
}

// missingPermissionIsSaid runs a relay-only and an adapter-only process,
// role's user without its dir permission i, the other's with all the
// documented ones, enqueues an intent and polls both /readyz until role's
// process logs the violation naming the subject.
func missingPermissionIsSaid(t *testing.T, role, dir string, i int) {
	pool := testdb.New(t)
	users := documentedNATSUsers(t, namespaceOf(t, pool), []string{file.Kind})
	p := permsOf(users[role], dir)
	removed := p.Allow[i]
	// Replaced by a subject nothing uses: an empty allow list is no
	// restriction at all to nats-server.
	p.Allow = slices.Clone(p.Allow)
	p.Allow[i] = "fencegate.permission.removed"
	srv := natstest.StartWith(t, func(o *server.Options) {
		o.Users = []*server.User{users["fencegate-relay"], users["fencegate-adapters"]}
	})

	begin := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	logs := map[string]*faulttest.SyncBuffer{"fencegate-relay": {}, "fencegate-adapters": {}}
	var addrs []string
	done := make(chan struct{}, 2)
	for _, r := range []string{"fencegate-relay", "fencegate-adapters"} {
		cfg := Config{Pool: pool, Dispatcher: &dispatcher.Config{}}
		if r == "fencegate-adapters" {
			cfg = Config{Pool: pool, Adapters: []adapters.Registration{fileRegistration(t, nil)}}
		}
		cfg = withUser(cfg, srv.URL, users[r], logs[r])
		cfg.MetricsAddr = fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
		addrs = append(addrs, cfg.MetricsAddr)
		g, err := New(pool, nil, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Start may wait (the adapters wait for the stream) or fail (a
		// consumer it may not create): in the background, stopped at the
		// end.
		go func() {
			defer func() { done <- struct{}{} }()
			if err := g.Start(ctx); err != nil {
				fmt.Fprintf(logs[r], "Start: %v\n", err)
			}
		}()
		defer g.Stop()
	}
	defer func() {
		cancel()
		<-done
		<-done
	}()
	// An intent, so that there is something to publish, deliver and ack.
	l, err := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())).Acquire(ctx, "perm", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := coretest.Outbox(t, pool).Enqueue(ctx, outbox.Intent{Resource: "perm", Epoch: l.Epoch, OperationID: "op", Kind: file.Kind,
		Payload: []byte(`{"target":"a.txt","content":"x"}`)}); err != nil {
		t.Fatal(err)
	}
	verb := map[string]string{"publish": "Publish", "subscribe": "Subscription"}[dir]
	want := fmt.Sprintf(`Permissions Violation for %s to \"%s`, verb, strings.TrimSuffix(removed, ">"))
	deadline := begin.Add(45 * time.Second)
	for !strings.Contains(logs[role].String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("without %s %q, %s logged no violation naming it in 45 s (want %s):\n%s", dir, removed, role, want, logs[role].String())
		}
		// /readyz asks for the stream and each consumer.
		for _, a := range addrs {
			if resp, err := http.Get("http://" + a + "/readyz"); err == nil {
				resp.Body.Close()
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("without %s %q, after %s: %s", dir, removed, time.Since(begin).Round(time.Millisecond), firstLine(logs[role].String(), want))
}

// firstLine is the first line of s holding sub.
func firstLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// permsOf is u's publish or subscribe permission.
func permsOf(u *server.User, dir string) *server.SubjectPermission {
	if dir == "publish" {
		return u.Permissions.Publish
	}
	return u.Permissions.Subscribe
}

// documentedNATSUsers reads the nats-server configuration block of
// docs/operations.md's "NATS users for gateway run", with ns for
// <namespace>, each line holding <kind> once per kind and a random
// password of each user, and returns its users by name.
func documentedNATSUsers(t *testing.T, ns wire.Namespace, kinds []string) map[string]*server.User {
	t.Helper()
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## NATS users for gateway run")
	if !ok {
		t.Fatal("docs/operations.md has no section NATS users for gateway run")
	}
	_, block, ok := strings.Cut(section, "\n```conf\n")
	if ok {
		block, _, ok = strings.Cut(block, "\n```\n")
	}
	if !ok {
		t.Fatal("the section NATS users for gateway run has no ```conf block")
	}
	var conf strings.Builder
	for _, line := range strings.SplitAfter(block, "\n") {
		if !strings.Contains(line, "<kind>") {
			conf.WriteString(line)
			continue
		}
		for _, k := range kinds {
			conf.WriteString(strings.ReplaceAll(line, "<kind>", k))
		}
	}
	text := strings.ReplaceAll(conf.String(), "<namespace>", string(ns))
	for _, pw := range []string{"<relay password>", "<adapters password>"} {
		text = strings.ReplaceAll(text, pw, randomHex(t))
	}
	if strings.Contains(text, "<") {
		t.Fatalf("a placeholder is left in the block:\n%s", text)
	}
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("the documented block is no nats-server configuration: %v\n%s", err, text)
	}
	if !opts.JetStream {
		t.Fatal("the documented block does not enable JetStream")
	}
	users := map[string]*server.User{}
	for _, u := range opts.Users {
		users[u.Username] = u
	}
	if users["fencegate-relay"] == nil || users["fencegate-adapters"] == nil {
		t.Fatalf("the documented block has users %v, want fencegate-relay and fencegate-adapters", users)
	}
	return users
}

// union is a user with the relay's and the adapters' permissions.
func union(users map[string]*server.User) *server.User {
	r, a := users["fencegate-relay"].Permissions, users["fencegate-adapters"].Permissions
	return &server.User{Username: "fencegate", Password: users["fencegate-relay"].Password, Permissions: &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: slices.Concat(r.Publish.Allow, a.Publish.Allow)},
		Subscribe: &server.SubjectPermission{Allow: slices.Concat(r.Subscribe.Allow, a.Subscribe.Allow)},
	}}
}

func namespaceOf(t *testing.T, pool *pgxpool.Pool) wire.Namespace {
	t.Helper()
	info, err := deployment.Resolve(context.Background(), pool, testdb.Schema())
	if err != nil {
		t.Fatal(err)
	}
	return info.Namespace
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// withUser is cfg dialling url as u, logging to logs, with a metrics
// address for /readyz.
func withUser(cfg Config, url string, u *server.User, logs *faulttest.SyncBuffer) Config {
	cfg.Schema = testdb.Schema()
	cfg.NATSURL = strings.Replace(url, "nats://", "nats://"+u.Username+":"+u.Password+"@", 1)
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	return cfg
}

// startAs starts cfg as u, stopped at the test's end. A start that has
// not returned in 30 s (the adapters wait for the stream until ctx ends)
// fails the test.
func startAs(t *testing.T, url string, u *server.User, cfg Config, logs *faulttest.SyncBuffer) *Gateway {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := Start(ctx, withUser(cfg, url, u, logs))
	if err != nil {
		t.Fatalf("start as %s: %v\n%s", u.Username, err, logs.String())
	}
	t.Cleanup(g.Stop)
	return g
}

func enqueue(t *testing.T, pool *pgxpool.Pool, g *Gateway, resource, kind, payload string) int64 {
	t.Helper()
	ctx := context.Background()
	l, err := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())).Acquire(ctx, resource, "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res, err := g.Outbox().Enqueue(ctx, outbox.Intent{Resource: resource, Epoch: l.Epoch, OperationID: "op", Kind: kind, Payload: []byte(payload)})
	if err != nil {
		t.Fatal(err)
	}
	return res.IntentID
}

func waitSucceeded(t *testing.T, g *Gateway, id int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if rec, err := g.Outbox().Wait(ctx, id); err != nil || rec.Status != outbox.StatusSucceeded {
		t.Fatalf("intent %d: %+v %v, want succeeded", id, rec, err)
	}
}

func waitReady(t *testing.T, g *Gateway, name string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for p := getProbe(t, g.MetricsAddr(), "/readyz"); p.code != http.StatusOK; p = getProbe(t, g.MetricsAddr(), "/readyz") {
		if time.Now().After(deadline) {
			t.Fatalf("%s /readyz = %d %+v, want 200", name, p.code, p)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
