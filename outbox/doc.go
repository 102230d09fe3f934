// Package outbox is the worker-facing library of fencegate: it commits
// side-effect intents into the PostgreSQL outbox, fenced by the worker's
// epoch, and looks them up.
//
// # Guarantee
//
// Enqueue and EnqueueTx store an intent only if, at the moment of commit
// order, the epoch the worker supplies is the resource's current epoch. The
// check and the insert happen in one transaction that holds the resource's
// control row locked (SELECT … FOR UPDATE), the same row every lease grant
// and epoch advance updates; so no change of authority can fall between the
// check and the write. A worker whose lease was taken over — even one that
// paused after checking its lease — gets a *StaleEpochError
// (errors.Is(err, ErrStaleEpoch)) and nothing is stored.
//
// # Retries
//
// The operation id dedups a worker's retry of the same enqueue: when the
// response to a committed enqueue is lost, the retry with the same resource
// and operation id returns the intent that was committed, with Duplicate set,
// and stores nothing new — also when the epoch has moved on since, because a
// retry writes nothing. Same operation id with different content (kind,
// idempotency key, fence policy or payload) returns ErrOperationConflict.
//
// The business idempotency key (default "<resource>/<operation id>") is what
// adapters dedup the external effect on, across epochs and workers.
package outbox
