// Package failover is the PostgreSQL failover test (make failover, part of
// make chaos): a pg_auto_failover formation (monitor, primary, synchronous
// secondary; internal/testkit/autofailover) under a steady load of Go and
// SQL-interface workers, a relay and an adapter process on the formation's
// multi-host URL (target_session_attrs=read-write), while the primary is
// killed (kill -9 of the node with its PostgreSQL), the old node rejoins as
// a secondary, and the formation is switched over. Its test file builds
// only with -tags failover: it takes two to three minutes, too long for
// make test. FENCEGATE_FAILOVER_MUTATION=pinned pins the adapter process
// to the first primary's host (the test must then fail).
package failover
