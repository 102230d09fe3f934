package webhook_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencegate/fencegate/internal/testdb"
)

// TestMain runs the tests with a PostgreSQL server for the runtime tests
// (testdb), then checks for leaked goroutines, as goleak.VerifyTestMain
// would, after the throwaway cluster (if any) is stopped.
func TestMain(m *testing.M) {
	code := testdb.Run(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
