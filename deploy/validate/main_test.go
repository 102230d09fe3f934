package validate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// repoRoot is the fencegate tree this module sits in.
const repoRoot = "../.."

// gatewayBin is the gateway binary built from repoRoot once for the tests.
var gatewayBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fencegate-validate-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gatewayBin = filepath.Join(dir, "gateway")
	build := exec.Command("go", "build", "-o", gatewayBin, "./cmd/gateway")
	build.Dir = repoRoot
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build gateway: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// nonFlagEnv are the GATEWAY_* variables gateway run reads that are not
// GATEWAY_<FLAG> of one of its flags.
var nonFlagEnv = map[string]bool{
	"GATEWAY_TOKENS": true, // the admin API's tokens, when --tokens-file is not given
}

// envName is a flag's variable, as cli.EnvName: --db-max-conns is
// GATEWAY_DB_MAX_CONNS.
func envName(flag string) string {
	return "GATEWAY_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// runFlags returns gateway run's flags by the variable each is read from.
func runFlags(t *testing.T) map[string]string {
	t.Helper()
	cfg, err := printConfig([]string{"run"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	byEnv := map[string]string{}
	for flag := range cfg {
		byEnv[envName(flag)] = flag
	}
	if len(byEnv) < 20 {
		t.Fatalf("gateway run --print-config printed %d flags", len(byEnv))
	}
	return byEnv
}

// printConfig runs `gateway ARGS --print-config` with only env (and PATH)
// in its environment, so that the variables of the shell running the
// tests do not count, and returns the configuration it prints.
func printConfig(args []string, env map[string]string) (map[string]string, error) {
	cmd := exec.Command(gatewayBin, append(slices.Clone(args), "--print-config")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("gateway %s --print-config: %v: %s %s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	var pc struct{ Config map[string]string }
	if err := json.Unmarshal(out.Bytes(), &pc); err != nil || len(pc.Config) == 0 {
		return nil, fmt.Errorf("gateway %s --print-config printed %q (%v)", strings.Join(args, " "), out.String(), err)
	}
	return pc.Config, nil
}

// checkGatewayEnv checks a gateway container's environment against gateway
// run's flags (byEnv): every GATEWAY_* variable is a flag's (or one of
// nonFlagEnv), and, for a `gateway run` command line, the process accepts
// the command line with that environment and takes each variable's value
// for its flag where the command line does not give the flag. It returns
// how many variables it checked.
func checkGatewayEnv(t *testing.T, where string, byEnv map[string]string, args []string, env map[string]string) int {
	t.Helper()
	n := 0
	for k := range env {
		if !strings.HasPrefix(k, "GATEWAY_") {
			continue
		}
		n++
		if _, ok := byEnv[k]; !ok && !nonFlagEnv[k] {
			t.Errorf("%s: $%s is not the variable of a gateway run flag", where, k)
		}
	}
	if len(args) == 0 || args[0] != "run" {
		return n
	}
	cfg, err := printConfig(args, env)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return n
	}
	for k, v := range env {
		flag, ok := byEnv[k]
		if !ok || givenOnCommandLine(args, flag) {
			continue
		}
		got := cfg[flag]
		switch {
		case flag == "smtp-password" || strings.HasSuffix(flag, "-url"):
			// Printed redacted.
			if got == "" {
				t.Errorf("%s: $%s is set, --%s is empty", where, k, flag)
			}
		case got != v:
			t.Errorf("%s: $%s=%q, but --%s is %q", where, k, v, flag, got)
		}
	}
	return n
}

// givenOnCommandLine says whether args give --flag (as --flag V or --flag=V).
func givenOnCommandLine(args []string, flag string) bool {
	for _, a := range args {
		if a == "--"+flag || strings.HasPrefix(a, "--"+flag+"=") {
			return true
		}
	}
	return false
}

// flagValue returns the value args give --flag ("" if none).
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			return v
		}
		if a == "--"+flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// gateway run's stop bounds (cli/run.go, stopBound): how long a stop waits
// for its components before it gives up and exits 1, abandoning the
// executions still in flight (their outcomes unrecorded, their keys owned
// until --idempotency-lock-timeout).
const (
	stopTimeout           = 30 * time.Second // a relay alone
	stopRecordMargin      = 30 * time.Second // with adapters: --execute-timeout + this
	defaultExecuteTimeout = 30 * time.Second // executor.DefaultExecuteTimeout, for --execute-timeout 0
	// stopGraceMargin is what a grace period (compose's stop_grace_period,
	// Kubernetes' terminationGracePeriodSeconds) must leave beyond the
	// bound before the SIGKILL: the process names what it abandons, then
	// exits.
	stopGraceMargin = 10 * time.Second
)

// stopBound is the bound of a `gateway run` whose configuration, as
// --print-config prints it, is cfg.
func stopBound(cfg map[string]string) (time.Duration, error) {
	adapters := false
	for a := range strings.SplitSeq(cfg["adapters"], ",") {
		adapters = adapters || strings.TrimSpace(a) != ""
	}
	if !adapters {
		return stopTimeout, nil
	}
	et, err := time.ParseDuration(cfg["execute-timeout"])
	if err != nil {
		return 0, fmt.Errorf("--execute-timeout %q: %v", cfg["execute-timeout"], err)
	}
	if et <= 0 {
		et = defaultExecuteTimeout
	}
	return max(stopTimeout, et+stopRecordMargin), nil
}

// checkStopGrace checks that grace, the time a container runtime gives
// the `gateway run` of args and env between SIGTERM and SIGKILL, covers
// its stop bound with stopGraceMargin to spare. It returns the bound.
func checkStopGrace(t *testing.T, where string, args []string, env map[string]string, grace time.Duration, graceName string) time.Duration {
	t.Helper()
	cfg, err := printConfig(args, env)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return 0
	}
	bound, err := stopBound(cfg)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return 0
	}
	if grace < bound+stopGraceMargin {
		t.Errorf("%s: %s %v: the process may take %v to stop (--adapters %q, --execute-timeout %s), want at least %v: the runtime kills an execution still in flight, its outcome unrecorded",
			where, graceName, grace, bound, cfg["adapters"], cfg["execute-timeout"], bound+stopGraceMargin)
	}
	return bound
}
