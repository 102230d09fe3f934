package cli

import (
	"encoding/json"
	"os"
	"testing"
)

// The shipped Grafana dashboard (deploy/grafana/fencegate.json) queries
// the Prometheus data source its importer picks: a datasource variable,
// DS_PROMETHEUS, of type prometheus, and every panel and every panel's
// query names it rather than a data source uid of one Grafana.
// (deploy/validate checks the compose file and the Kubernetes manifests,
// which need a YAML decoder this module does not require.)
func TestDashboardDatasourceVariable(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../deploy/grafana/fencegate.json")
	if err != nil {
		t.Fatal(err)
	}
	type datasource struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	var d struct {
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query string `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title      string      `json:"title"`
			Datasource *datasource `json:"datasource"`
			Targets    []struct {
				RefID      string      `json:"refId"`
				Datasource *datasource `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	const name = "DS_PROMETHEUS"
	want := datasource{Type: "prometheus", UID: "${" + name + "}"}
	vars := 0
	for _, v := range d.Templating.List {
		if v.Name == name {
			vars++
			if v.Type != "datasource" || v.Query != "prometheus" {
				t.Errorf("templating variable %s: type %q query %q, want datasource, prometheus", name, v.Type, v.Query)
			}
		}
	}
	if vars != 1 {
		t.Fatalf("the dashboard's templating list has %d variables named %s, want 1", vars, name)
	}
	panels, targets := 0, 0
	for _, p := range d.Panels {
		panels++
		if p.Datasource == nil || *p.Datasource != want {
			t.Errorf("panel %q: datasource %+v, want %+v", p.Title, p.Datasource, want)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			targets++
			if tg.Datasource == nil || *tg.Datasource != want {
				t.Errorf("panel %q query %s: datasource %+v, want %+v", p.Title, tg.RefID, tg.Datasource, want)
			}
		}
	}
	t.Logf("%d panels, %d queries on %s", panels, targets, want.UID)
	if panels == 0 || targets == 0 {
		t.Fatal("the dashboard has no panels or no queries")
	}
}
