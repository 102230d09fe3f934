// Package s3 is the adapter that executes "s3" intents: it publishes an
// object to S3 or an S3-compatible server, fenced at the destination by
// conditional writes.
//
// # The fence
//
// Every object carries, in its metadata, the epoch, resource, intent id,
// idempotency key and SHA-256 of the publication that wrote it. A
// publication reads the object's metadata (HEAD), refuses when it holds a
// newer epoch (superseded, naming both), and otherwise writes conditionally
// on the version it read: If-Match its ETag, If-None-Match: * when there is
// none. Another writer in between makes the condition false (412): it reads
// again. The comparison and the write are therefore one atomic step at the
// destination, and a paused writer with an older epoch can never overwrite
// a newer object, however late it resumes.
//
// Some S3-compatible servers accept If-Match and ignore it, which would turn
// the fence off without a sound: Probe (run by the gateway at start) writes
// with a false condition and refuses to run unless the server answers 412.
//
// # Lookup
//
// An attempt whose answer was lost is looked up, under the runtime's
// settle rules: the object's metadata names the key (found; the lookup
// then also writes the receipt the lost attempt could not); else a receipt
// (ReceiptPrefix + sha256(bucket/key) + "/" + sha256(idempotency key),
// written after every publication) says it was published before a newer
// one replaced it; else, in a versioned bucket, an older version names it.
// The residual: a publication whose answer was lost and whose object was
// replaced by a newer epoch before any lookup, in an unversioned bucket,
// leaves no trace; it is then recorded superseded (the newer epoch is in
// place, as the fence wants), though it may have been visible in between.
//
// # What a payload cannot do
//
// It names only an allowed bucket (Config.Bucket, Config.Allow): another
// is refused at the intake (KindSpec, IntakeSpec) and fails at execute
// before any request. Its key is never under .fencegate/, where the
// adapter keeps its receipts and probes (s3kind.ReservedKey).
//
// # Receipts are signed
//
// A receipt carries an HMAC-SHA256 under Config.ReceiptSecrets over the
// result, bucket, key and idempotency key, so that a bucket writer cannot
// forge the proof of a publication. Without a secret none is written. A
// receipt that does not verify (forged, or unsigned from before) is no
// proof either way: unless the object or a version proves the
// publication, Lookup answers the unknown outcome, which the runtime
// records as held for an operator — never succeeded, never executed again.
package s3
