package validate

import (
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// composeFile is the part of the Compose specification deploy/compose.yaml
// uses; decoding is strict, so a misspelt key fails here.
type composeFile struct {
	Name     string                    `json:"name"`
	Services map[string]composeService `json:"services"`
	Volumes  map[string]any            `json:"volumes"`
}

type composeService struct {
	Image       string            `json:"image"`
	Build       string            `json:"build"`
	Command     []string          `json:"command"`
	Environment map[string]string `json:"environment"`
	Ports       []string          `json:"ports"`
	Volumes     []string          `json:"volumes"`
	DependsOn   map[string]struct {
		Condition string `json:"condition"`
	} `json:"depends_on"`
	// StopGracePeriod: how long compose waits after SIGTERM before it
	// kills the container ("" is compose's default, dockerDefaultStopGrace).
	StopGracePeriod string `json:"stop_grace_period"`
	Healthcheck     *struct {
		Test        []string `json:"test"`
		Interval    string   `json:"interval"`
		Timeout     string   `json:"timeout"`
		Retries     int      `json:"retries"`
		StartPeriod string   `json:"start_period"`
	} `json:"healthcheck"`
}

// dockerDefaultStopGrace is compose's stop_grace_period when none is given.
const dockerDefaultStopGrace = 10 * time.Second

// deploy/compose.yaml: every GATEWAY_* variable of a service running the
// gateway image is a gateway run flag's, and the gateway service's command
// line runs with its environment (--print-config); a service running
// gateway run has a stop_grace_period above its stop bound (checkStopGrace:
// compose's default, 10 s, killed an execution the gateway gave 60 s); its
// healthcheck is
// gateway probe on the metrics address's /healthz; the file adapter's root
// is on a named volume; email goes to the Mailpit service, at the version
// the tests run.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatalf("deploy/compose.yaml: %v", err)
	}
	byEnv := runFlags(t)
	gateways, vars := 0, 0
	for name, s := range c.Services {
		for dep := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("service %s depends on %s, which is not a service", name, dep)
			}
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if _, ok := c.Volumes[src]; !ok {
				t.Errorf("service %s mounts volume %s, not declared under volumes", name, src)
			}
		}
		if s.Build != ".." {
			for k := range s.Environment {
				if strings.HasPrefix(k, "GATEWAY_") {
					t.Errorf("service %s (image %s) has $%s", name, s.Image, k)
				}
			}
			continue
		}
		gateways++
		if len(s.Command) == 0 {
			t.Errorf("service %s runs the gateway with no command", name)
			continue
		}
		vars += checkGatewayEnv(t, "service "+name, byEnv, s.Command, s.Environment)
		if s.Command[0] == "run" {
			grace := dockerDefaultStopGrace
			if s.StopGracePeriod != "" {
				if grace, err = time.ParseDuration(s.StopGracePeriod); err != nil {
					t.Errorf("service %s: stop_grace_period %q: %v", name, s.StopGracePeriod, err)
					continue
				}
			}
			bound := checkStopGrace(t, "service "+name, s.Command, s.Environment, grace, "stop_grace_period")
			t.Logf("service %s: stop_grace_period %v, stop bound %v", name, grace, bound)
		}
	}
	if gateways != 2 || vars == 0 {
		t.Fatalf("%d services run the gateway image (want migrate and gateway), %d GATEWAY_* variables", gateways, vars)
	}

	g := c.Services["gateway"]
	metrics := flagValue(g.Command, "metrics-addr")
	_, port, err := net.SplitHostPort(metrics)
	if err != nil {
		t.Fatalf("the gateway service's --metrics-addr %q: %v", metrics, err)
	}
	if g.Healthcheck == nil {
		t.Fatal("the gateway service has no healthcheck")
	}
	hc := g.Healthcheck.Test
	probeURL := "http://127.0.0.1:" + port + "/healthz"
	if len(hc) < 4 || !slices.Equal(hc[:3], []string{"CMD", "/usr/local/bin/gateway", "probe"}) || hc[len(hc)-1] != probeURL {
		t.Errorf("the gateway's healthcheck is %q, want [CMD /usr/local/bin/gateway probe … %s]", hc, probeURL)
	} else {
		// The probe's flags parse: on a port nothing listens on it is
		// exit 1 (no answer), not 2 (bad input).
		args := append(slices.Clone(hc[3:len(hc)-1]), "http://127.0.0.1:1/healthz")
		err := exec.Command(gatewayBin, append([]string{"probe"}, args...)...).Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Errorf("gateway probe %q on a closed port: %v, want exit 1", args, err)
		}
	}

	root := g.Environment["GATEWAY_FILE_ROOT"]
	if !slices.Contains(strings.Split(flagValue(g.Command, "adapters"), ","), "file") || root == "" {
		t.Errorf("the gateway service runs no file adapter with GATEWAY_FILE_ROOT (adapters %q, root %q)", flagValue(g.Command, "adapters"), root)
	}
	onVolume := false
	for _, v := range g.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == root {
			_, named := c.Volumes[parts[0]]
			onVolume = onVolume || named
		}
	}
	if !onVolume {
		t.Errorf("the file adapter's root %s is not on a named volume: %q", root, g.Volumes)
	}

	m, ok := c.Services["mailpit"]
	tools, err := os.ReadFile("../../scripts/tools.sh")
	if err != nil {
		t.Fatal(err)
	}
	tested := regexp.MustCompile(`github\.com/axllent/mailpit@(v[0-9.]+)`).FindSubmatch(tools)
	if !ok || tested == nil || m.Image != "axllent/mailpit:"+string(tested[1]) {
		t.Errorf("mailpit service image %q, want axllent/mailpit:%s (scripts/tools.sh)", m.Image, tested)
	}
	if _, ok := g.DependsOn["mailpit"]; !ok {
		t.Error("the gateway service does not depend on mailpit")
	}
	if !slices.Contains(strings.Split(flagValue(g.Command, "adapters"), ","), "email") || g.Environment["GATEWAY_MAIL_FROM_ALLOW"] == "" {
		t.Error("the gateway service runs no email adapter with a mail policy")
	}
	if host, _, _ := net.SplitHostPort(g.Environment["GATEWAY_SMTP_ADDR"]); host != "mailpit" {
		t.Errorf("GATEWAY_SMTP_ADDR %q is not the mailpit service", g.Environment["GATEWAY_SMTP_ADDR"])
	}
	if u, err := url.Parse(g.Environment["GATEWAY_MAILPIT_URL"]); err != nil || u.Hostname() != "mailpit" {
		t.Errorf("GATEWAY_MAILPIT_URL %q is not the mailpit service", g.Environment["GATEWAY_MAILPIT_URL"])
	}
	t.Logf("%d services, %d run the gateway image with %d GATEWAY_* variables; healthcheck %q", len(c.Services), gateways, vars, hc)
}

// The Dockerfile's ENV GATEWAY_* lines name gateway run flags.
func TestDockerfileEnv(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	byEnv := runFlags(t)
	n := 0
	for _, m := range regexp.MustCompile(`(?m)^ENV (GATEWAY_[A-Z0-9_]+)=`).FindAllSubmatch(b, -1) {
		n++
		if _, ok := byEnv[string(m[1])]; !ok {
			t.Errorf("Dockerfile: ENV %s is not the variable of a gateway run flag", m[1])
		}
	}
	t.Logf("%d GATEWAY_* variables in the Dockerfile", n)
	if n == 0 {
		t.Fatal("no ENV GATEWAY_* in the Dockerfile")
	}
}

// .dockerignore keeps what is not the module's source out of the build
// context: the tests' tools and data (bin/, var/, gigabytes), .git, test
// binaries and profiles.
func TestDockerignore(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(b), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			patterns = append(patterns, l)
		}
	}
	for _, want := range []string{".git", "bin/", "var/", "**/node_modules/", "*.test", "*.prof"} {
		if !slices.Contains(patterns, want) {
			t.Errorf(".dockerignore lacks %q", want)
		}
	}
	for _, p := range patterns {
		if p == "*.go" || p == "go.mod" || p == "go.sum" || p == "cmd/" || strings.HasPrefix(p, "!") {
			t.Errorf(".dockerignore pattern %q would leave the build without the module's source", p)
		}
	}
	t.Logf("%d patterns in .dockerignore", len(patterns))
}
