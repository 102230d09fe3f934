package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/wire"
)

// Two deployments (two databases) relaying through one NATS server: each
// has its own namespace (derived per database, recorded at migrate), so
// its stream, subjects, consumers and message ids are its own. Intents with
// the same ids in both all end succeeded within a few seconds — with one
// shared stream the second deployment's messages were swallowed by the
// first's duplicate window and waited for the relay timeout (60 s here),
// and an adapter loaded intent <id> from its own database for the other's
// message — and every file holds its own deployment's content. A message
// on a deployment's subject carrying another namespace is terminated
// unexecuted and counted (fencegate_adapter_foreign_messages_total).
func TestTwoDeploymentsOneNATS(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	const n = 40
	type deployment struct {
		name, db, root, metrics, ns string
		p                           *gatewayProc
		pool                        *pgxpool.Pool
	}
	deps := []*deployment{{name: "A"}, {name: "B"}}
	for _, d := range deps {
		db, p := runPool(t)
		d.db, d.pool = db, p
		r := gw(t, db, "migrate")
		expectCode(t, r, 0, "")
		d.ns, _ = r.obj["namespace"].(string)
		if _, err := wire.ParseNamespace(d.ns); err != nil || r.obj["namespace_explicit"] != false {
			t.Fatalf("migrate: namespace %v (explicit %v): %v", r.obj["namespace"], r.obj["namespace_explicit"], err)
		}
		expectCode(t, gw(t, db, "epoch", "advance", "--resource", "backlog", "--epoch", "1"), 0, "")
		if _, err := p.Exec(context.Background(), testdb.SQL(`
			INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
			SELECT 'backlog', 1, 'op-' || g, 'file', 'key-' || g, 'execute',
			       jsonb_build_object('target', 'out/' || g, 'content', $2 || '-' || g)
			FROM generate_series(1, $1) g`), n, d.name); err != nil {
			t.Fatal(err)
		}
		d.root = t.TempDir()
		d.metrics = freeAddr(t)
	}
	if deps[0].ns == deps[1].ns {
		t.Fatalf("both databases have namespace %q", deps[0].ns)
	}
	start := time.Now()
	for _, d := range deps {
		d.p = startRun(t, nil, d.db, srv.URL, "--adapters", "file", "--file-root", d.root, "--metrics-addr", d.metrics,
			"--relay-timeout", "60s", "--poll-interval", "200ms")
	}
	for _, d := range deps {
		pollUntil(t, 40*time.Second, "deployment "+d.name+"'s intents to succeed", func() (bool, string) {
			ok := testdb.Int(t, d.pool, `SELECT count(*) FROM fencegate.intents WHERE status = 'succeeded'`)
			return ok == n, fmt.Sprintf("%d of %d succeeded", ok, n)
		})
	}
	t.Logf("both deployments drained %d intents each in %s", n, time.Since(start).Round(time.Millisecond))
	for _, d := range deps {
		for i := 1; i <= n; i++ {
			b, err := os.ReadFile(filepath.Join(d.root, "out", strconv.Itoa(i)))
			if want := fmt.Sprintf("%s-%d", d.name, i); err != nil || string(b) != want {
				t.Fatalf("deployment %s: out/%d = %q, %v; want %q", d.name, i, b, err, want)
			}
		}
	}

	// Another namespace's message on A's subject: refused, unexecuted.
	a := deps[0]
	nc := natstest.Connect(t, srv.URL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg := nats.NewMsg(wire.Namespace(a.ns).Subject("file"))
	msg.Header.Set(wire.HeaderIntentID, "1")
	msg.Header.Set(wire.HeaderNamespace, deps[1].ns)
	msg.Header.Set(nats.MsgIdHdr, "foreign-1")
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 20*time.Second, "the foreign message to be counted", func() (bool, string) {
		res, err := http.Get("http://" + a.metrics + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return strings.Contains(string(b), `fencegate_adapter_foreign_messages_total{kind="file"} 1`), "not yet"
	})
	// The settle latency histogram saw each of A's intents.
	if res, err := http.Get("http://" + a.metrics + "/metrics"); err == nil {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if !strings.Contains(string(b), fmt.Sprintf(`fencegate_adapter_settle_seconds_count{kind="file"} %d`, n)) {
			t.Errorf("fencegate_adapter_settle_seconds_count for file is not %d:\n%s", n, grepMetric(string(b), "fencegate_adapter_settle_seconds_count"))
		}
	}
	if !strings.Contains(a.p.stderr.String(), "message of another namespace") {
		t.Errorf("the refusal is not logged:\n%s", a.p.stderr.String())
	}
}

// gateway migrate --namespace records an explicit namespace (shown by
// migrate); gateway run with another --namespace is exit 2 naming
// namespace, as is a namespace that is not one.
func TestNamespaceFlags(t *testing.T) {
	t.Parallel()
	db, _ := runPool(t)
	for _, bad := range []string{"Prod", "-x", "a.b", strings.Repeat("x", 33), "a b"} {
		r := gw(t, db, "migrate", "--namespace", bad)
		if e, _ := r.obj["error"].(map[string]any); r.code != exitBadInput || e["field"] != "namespace" {
			t.Fatalf("migrate --namespace %q: exit %d %s, want 2 naming namespace", bad, r.code, r.stdout)
		}
		runBadFlags(t, nil, []string{"--adapters", "", "--namespace", bad}, "namespace")
	}
	r := gw(t, db, "migrate", "--namespace", "prod-eu_1")
	expectCode(t, r, 0, "")
	if r.obj["namespace"] != "prod-eu_1" || r.obj["namespace_explicit"] != true {
		t.Fatalf("migrate --namespace: %s", r.stdout)
	}
	if r := gw(t, db, "migrate"); r.obj["namespace"] != "prod-eu_1" {
		t.Fatalf("a second migrate changed the namespace: %s", r.stdout)
	}
	srv := natstest.Start(t)
	r = gwEnv(t, []string{"GATEWAY_MAIL_FROM_ALLOW=example.com"}, db, "run", "--nats-url", srv.URL, "--adapters", "file", "--namespace", "staging")
	if e, _ := r.obj["error"].(map[string]any); r.code != exitBadInput || e["field"] != "namespace" {
		t.Fatalf("run --namespace staging on prod-eu_1's database: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	p := startRun(t, nil, db, srv.URL, "--adapters", "file", "--namespace", "prod-eu_1", "--stream-max-age", "3h", "--duplicate-window", "5m")
	pollUntil(t, 30*time.Second, "the stream of namespace prod-eu_1", func() (bool, string) {
		return strings.Contains(p.stderr.String(), "GATEWAY_INTENTS_prod-eu_1"), "not in the log yet"
	})
	// The stream flags reach the stream.
	js, err := jetstream.New(natstest.Connect(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	var st jetstream.Stream
	pollUntil(t, 30*time.Second, "the relay's stream", func() (bool, string) {
		st, err = js.Stream(context.Background(), "GATEWAY_INTENTS_prod-eu_1")
		return err == nil, fmt.Sprint(err)
	})
	if c := st.CachedInfo().Config; c.MaxAge != 3*time.Hour || c.Duplicates != 5*time.Minute {
		t.Errorf("stream max age %s, duplicate window %s; want --stream-max-age 3h, --duplicate-window 5m", c.MaxAge, c.Duplicates)
	}
}

// grepMetric returns the lines of a /metrics body that start with name.
func grepMetric(body, name string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, name) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
