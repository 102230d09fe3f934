package validate

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

var metricName = regexp.MustCompile(`\bfencegate_[a-z_]+\b`)

// Every metric an alert of deploy/prometheus/alerts.yml reads is plotted
// on the dashboard (deploy/grafana/fencegate.json), so that whoever gets
// the alert sees what it counted (the takeover alert counted SQL and CLI
// workers' grants, fencegate_worker_lease_takeovers_total, which no panel
// showed).
func TestDashboardShowsWhatAlertsRead(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../grafana/fencegate.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	plotted := map[string]bool{}
	var ids []int
	for _, p := range d.Panels {
		if slices.Contains(ids, p.ID) {
			t.Errorf("panel %q: id %d is another panel's", p.Title, p.ID)
		}
		ids = append(ids, p.ID)
		for _, tg := range p.Targets {
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				plotted[m] = true
			}
		}
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts++
			for _, m := range metricName.FindAllString(r.Expr, -1) {
				if !plotted[m] {
					t.Errorf("alert %s reads %s, which no dashboard panel plots", r.Alert, m)
				}
			}
		}
	}
	if alerts == 0 || len(plotted) == 0 {
		t.Fatalf("%d alerts, %d metrics plotted", alerts, len(plotted))
	}
	t.Logf("%d alerts read only metrics among the %d the dashboard's %d panels plot", alerts, len(plotted), len(d.Panels))
}
