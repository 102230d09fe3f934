package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// gatewayBin is the gateway binary built once for this package's tests,
// which run it as a real process.
var gatewayBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fencegate-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gatewayBin = filepath.Join(dir, "gateway")
	// With the failpoints compiled in (inert unless GATEWAY_FAILPOINTS arms
	// one): process tests pause the dispatcher at a failpoint instead of a
	// test hook in the production binary.
	build := exec.Command("go", "build", "-tags", "failpoints", "-o", gatewayBin, "../cmd/gateway")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build gateway: %v\n", err)
		os.Exit(1)
	}
	code := testdb.Run(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
