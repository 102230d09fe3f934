// fencegate for TypeScript and JavaScript workers, over node-postgres: thin
// over fencegate's versioned SQL interface (docs/sql.md). Enqueue an intent
// in your own transaction, fenced by your lease's epoch; acquire, renew and
// release leases; a Keeper that renews a lease in the background and aborts
// an AbortSignal, judged on the monotonic clock, when it can no longer be
// trusted. Refusals are typed errors (StaleEpochError for ZF002, …).

export * from './errors';
export * from './client';
export * from './keeper';
