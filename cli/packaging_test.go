package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// What can be checked of the packaging without a container runtime (this
// machine has the docker client and no daemon, and cannot pull images):
// the Dockerfile builds a static binary and runs it as non-root, and the
// compose file's gateway command line and environment are ones `gateway
// run` accepts (--print-config parses them as the container would, and
// exits 0).
func TestPackagingFiles(t *testing.T) {
	t.Parallel()
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=0", "USER 65532:65532", `ENTRYPOINT ["/usr/local/bin/gateway"]`, "distroless/static"} {
		if !strings.Contains(string(df), want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if regexp.MustCompile(`(?m)^USER (0|root)\b`).Match(df) {
		t.Error("the Dockerfile runs as root")
	}
	compose, err := os.ReadFile("../deploy/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The gateway service's command: one JSON-style list on one line.
	m := regexp.MustCompile(`(?s)  gateway:.*?command: (\[[^\n]*\])`).FindSubmatch(compose)
	if m == nil {
		t.Fatal("no gateway command in deploy/compose.yaml")
	}
	var args []string
	if err := json.Unmarshal(m[1], &args); err != nil {
		t.Fatalf("gateway command %s: %v", m[1], err)
	}
	env := []string{}
	for _, kv := range regexp.MustCompile(`(?m)^      (GATEWAY_[A-Z_]+): (.+)$`).FindAllSubmatch(compose, -1) {
		env = append(env, string(kv[1])+"="+string(kv[2]))
	}
	cmd := exec.Command(gatewayBin, append(args, "--print-config")...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gateway %v --print-config with the compose environment: %v\n%s", args, err, out)
	}
	if !strings.Contains(string(out), `"admin-addr":"0.0.0.0:8080"`) || strings.Contains(string(out), "change-me-operator") {
		t.Errorf("print-config: %s", out)
	}
}
