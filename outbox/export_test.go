package outbox

import "github.com/fencegate/fencegate/internal/intents"

// SweepSQL is the sweeper's statement, for the plan test.
var SweepSQL = intents.SweepSQL
