package email_test

import (
	"os"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// TestMain runs the tests with a PostgreSQL server for the runtime tests
// (testdb), then checks for leaked goroutines.
func TestMain(m *testing.M) { os.Exit(testdb.RunLeakChecked(m)) }
