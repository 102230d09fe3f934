// Package file is the adapter for intents of kind "file": it publishes an
// intent's content to <Root>/<target>, and the destination itself does the
// fencing.
//
// # Guarantee
//
// For every target, under an exclusive lock held at the destination (an
// flock on a hidden per-target lock file), the adapter compares the intent's
// epoch with the newest epoch already accepted for that target, which it
// keeps durably beside the file in a small manifest. An older epoch is
// rejected (outcome "superseded") and nothing changes; an equal or newer one
// is switched in. So once epoch 34 has been accepted for a target, no
// publication with epoch 33 can ever replace it, however late it arrives —
// the article's paused worker A cannot overwrite B's result.
//
// Readers never see a partial file: the content is staged in the target's
// directory, written, fsynced, and renamed over the target; the directory is
// fsynced after the renames a crash order rests on (the manifest written
// ahead, then the content), not after the final "published" mark, which the
// content's sha proves anyway. Concurrent publications into one directory
// share those directory fsyncs: each waits for one that started after its
// rename, which keeps every crash order (see dirsync.go).
//
// Every publication is identified by its business idempotency key. The
// manifest keeps the current publication and a bounded history of earlier
// ones (Config.HistoryLimit), so a redelivery after a lost outcome is
// recognised — by Lookup or by Execute itself — and answered with the
// recorded result, without rewriting the file. The crash orders this
// relies on are described next to the code in Adapter.Execute.
//
// Targets are clean relative paths (filekind.ValidateTarget) that must stay
// inside Root: "..", absolute paths and symbolic links leading out of Root
// are permanent errors. Symbolic links to directories inside Root are
// followed, and fencing is keyed by the real directory, so two spellings of
// one file share one fence. A target that is itself a symbolic link is
// refused, wherever it points. The target policy (Config.Allow, dotfiles)
// is matched on the logical target and, at execute, on the path it
// resolves to, and the directory written in is opened one component at a
// time so that it is the one that path names. A key already published to a
// target that someone has since replaced by a directory or a symbolic link
// is still found (the manifest beside it records it): only a new
// publication is refused there.
//
// # Files at the destination
//
// Beside a published file <dir>/<name> the adapter keeps hidden files:
//
//	<dir>/.<name>.fencegate.json    the manifest (see Manifest)
//	<dir>/.<name>.fencegate.lock    the lock file, empty, never removed
//	<dir>/.<name>.fencegate.staged  the content being staged (transient)
//	<dir>/.<name>.fencegate.json.tmp the manifest being written (transient)
//
// Names of that shape (a leading dot and ".fencegate.") are reserved: a
// target using one is a permanent error.
//
// # What it does not cover
//
//   - It needs a local POSIX file system with atomic rename(2), working
//     fsync of files and directories, and flock(2) (Linux ext4, xfs, btrfs,
//     tmpfs, …). It is not safe on NFS or other network file systems, where
//     flock and rename atomicity are not guaranteed, and it builds on Unix
//     only.
//   - The fence holds only among writers that go through this adapter (or
//     honour its lock and manifest). Anything else writing the files is
//     outside the guarantee.
//   - Epochs are only comparable within one resource: the manifest records
//     the resource that published the target, and an intent of another
//     resource is refused (ErrForeignResource) until an operator removes
//     the manifest.
//   - Lookup recognises a key only while it is the current publication or
//     within the last Config.HistoryLimit publications of the target.
//   - The first publication to a target replaces whatever file was there
//     before without a manifest.
package file
