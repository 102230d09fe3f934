// Package article holds the fault tests of the source article, point 7:
// each pauses or crashes real gateway processes (built with -tags
// failpoints) at a named point, against a real PostgreSQL, a real
// nats-server process and a real SMTP server (Mailpit).
package article

import (
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/faulttest"
)

func TestMain(m *testing.M) { faulttest.Main(m) }
