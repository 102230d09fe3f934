package gateway

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

var metricRE = regexp.MustCompile(`\bfencegate_[a-z_]+\b`)

// The alert rules and the dashboard that ship in deploy/ name only metrics
// that exist: each name is served by a running gateway's /metrics (here
// with the relay, the file adapter and an intent carried through), or is
// a metric the code defines that this process does not register (the
// admin intake's takeovers). The counters the failed-rate and
// lost-ownership alerts read with rate() and increase() are served at 0
// before their first count, or the first one would not count. Every rule has an alert name, an
// expression with balanced brackets and a summary. (That each alert fires
// on its scenario is make alerts: promtool test rules, outside make test.)
func TestShippedAlertsAndDashboardNameRealMetrics(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ns := natstest.Start(t)
	reg := NewRegistry()
	g, err := Start(context.Background(), Config{Schema: testdb.Schema(), Pool: pool, NATSURL: ns.URL, RunDispatcher: true, MetricsAddr: "127.0.0.1:0",
		Registry: reg, Adapters: []adapters.Registration{fileRegistration(t, reg)}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	ctx := context.Background()
	l, err := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())).Acquire(ctx, "alerts", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res, err := g.Outbox().Enqueue(ctx, outbox.Intent{Resource: "alerts", Epoch: l.Epoch, OperationID: "op", Kind: file.Kind,
		Payload: []byte(`{"target":"a.txt","content":"x"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Outbox().Enqueue(ctx, outbox.Intent{Resource: "alerts", Epoch: l.Epoch, OperationID: "pending", Kind: "email",
		Payload: []byte(`{"to":"a@example.com","from":"b@example.com","subject":"s","text":"t"}`)}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if rec, err := g.Outbox().Wait(wctx, res.IntentID); err != nil || rec.Status != outbox.StatusSucceeded {
		t.Fatalf("intent: %v %v", rec, err)
	}
	resp, err := http.Get("http://" + g.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	served := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			served[strings.Fields(name)[0]] = true
		}
	}
	// The email intent has no adapter here: pending or relayed, counted.
	if !regexp.MustCompile(`fencegate_intents\{kind="email",status="(pending|relayed)"\} 1\n`).MatchString(string(body)) {
		t.Errorf("/metrics does not count the waiting email intent:\n%s", grepLines(string(body), "fencegate_intent"))
	}
	for _, series := range []string{`fencegate_effect_after_lost_ownership_total{kind="file"} 0`,
		`fencegate_adapter_outcomes_total{kind="file",outcome="failed"} 0`} {
		if !strings.Contains(string(body), "\n"+series+"\n") {
			t.Errorf("/metrics does not serve %s before anything counted:\n%s", series, grepLines(string(body), strings.SplitN(series, "{", 2)[0]))
		}
	}
	defined := definedMetrics(t)

	rules, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	dash, err := os.ReadFile("../deploy/grafana/fencegate.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(dash, &d); err != nil || len(d.Panels) == 0 {
		t.Fatalf("dashboard: %v (%d panels)", err, len(d.Panels))
	}
	var exprs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	alerts := 0
	for _, block := range strings.Split(string(rules), "- alert: ")[1:] {
		alerts++
		name := strings.TrimSpace(strings.SplitN(block, "\n", 2)[0])
		m := regexp.MustCompile(`(?m)^\s+expr: (.+)$`).FindStringSubmatch(block)
		if m == nil || !strings.Contains(block, "summary:") {
			t.Errorf("alert %s: no expr or no summary", name)
			continue
		}
		exprs = append(exprs, m[1])
	}
	if alerts < 6 {
		t.Errorf("%d alerts, want the stuck pending, unknown, failed rate, relay lag, backlog, takeovers ones", alerts)
	}
	for _, e := range exprs {
		if strings.Count(e, "(") != strings.Count(e, ")") || strings.Count(e, "{") != strings.Count(e, "}") || strings.Count(e, "[") != strings.Count(e, "]") {
			t.Errorf("unbalanced expression: %s", e)
		}
		for _, name := range metricRE.FindAllString(e, -1) {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
			if !served[base] && !defined[base] {
				t.Errorf("%s names %s, which no process serves and the code does not define", e, name)
			}
		}
	}
}

// definedMetrics are the fencegate_* names the (non-test) code spells out.
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && p != ".." || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range regexp.MustCompile(`Name:\s+"(fencegate_[a-z_]+)"`).FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
