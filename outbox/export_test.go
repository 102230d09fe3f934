package outbox

// SweepSQL is the sweeper's statement, for the plan test.
var SweepSQL = sweepSQL
