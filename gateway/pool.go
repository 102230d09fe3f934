package gateway

import (
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/idempotency"
)

// Connections the pool of `gateway run` is sized for, per component (see
// Config.PoolSize). Each is the number of statements the component
// can have in flight at once, since a pooled connection serves one
// statement or transaction at a time.
const (
	// poolConnsDispatcher: the claims, each a transaction held from its
	// claim to its mark (dispatcher.MaxOpenClaims), the backlog samples
	// and the LISTEN connection, which is acquired from the pool and then
	// hijacked out of it.
	poolConnsDispatcher = dispatcher.MaxOpenClaims + 2
	// poolConnsSweeper: one sweeper (intents or idempotency keys) deletes
	// one batch at a time.
	poolConnsSweeper = 1
	// poolConnsAdmin: the admin API and pages, a few requests at once
	// (readiness probes, an operator's page) beside the workload.
	poolConnsAdmin = 2
	// poolConnsSpare: start-up checks (fsync, migrations level) and a
	// statement outside any component's own budget never wait for one.
	poolConnsSpare = 1
	// poolConnsMin is the floor, pgxpool's own minimum default.
	poolConnsMin = 4
	// poolConnsGroup: with group commit the shared transactions of the
	// idempotency store (Begins and Completes, DefaultGroupFlushers each)
	// and the runtime's batched intent loads (2 at once), whatever the
	// adapters' concurrency.
	poolConnsGroup = 2*idempotency.DefaultGroupFlushers + 2
	// poolConnsPerAdapterGrouped: with group commit an execution holds a
	// connection of its own only for the statements outside the shared
	// transactions (a wait for proof, a release, a decision taken alone),
	// each short, and the runtime's batched epoch reads of the execute
	// fence (2 at once) take theirs from the same share: they share this
	// many per adapter.
	poolConnsPerAdapterGrouped = 8
)

// PoolSize is the MaxConns `gateway run` gives its pool when neither
// --db-max-conns nor the URL's pool_max_conns says otherwise:
//
//	spare (1)
//	+ with the dispatcher: 6 (4 open claims, samples, LISTEN) + 1 (intent sweeper)
//	+ with adapters and group commit (the default): 10 for the shared
//	  transactions and loads + min(concurrency, 8) per adapter + 1
//	  (idempotency key sweeper)
//	+ with adapters, without group commit: the sum of every adapter's
//	  concurrency (each execution holds at most one connection at a time)
//	  + 1 (idempotency key sweeper)
//	+ with the admin server: 2
//
// and at least 4. With its defaults (dispatcher, email and file, group
// commit, no admin server) that is 1 + 7 + 10 + 2×8 + 1 = 35.
// Connections are opened on demand, so an idle process holds fewer.
func (c *Config) PoolSize() int32 {
	n := poolConnsSpare
	if c.runsDispatcher() {
		n += poolConnsDispatcher + poolConnsSweeper
	}
	if executors := c.executors(); executors > 0 {
		// Unset: the runtime's default (executor.DefaultConcurrency), as the flag's.
		per := c.Runtime.Concurrency
		if per < 1 {
			per = executor.DefaultConcurrency
		}
		if c.Idempotency.GroupCommit {
			n += poolConnsGroup + executors*min(per, poolConnsPerAdapterGrouped)
		} else {
			n += executors * per
		}
		n += poolConnsSweeper
	}
	if c.AdminAddr != "" {
		n += poolConnsAdmin
	}
	return int32(max(n, poolConnsMin))
}
