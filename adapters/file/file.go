package file

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/failpoint"
	"github.com/fencegate/fencegate/internal/fencemetrics"
	"github.com/fencegate/fencegate/kinds/filekind"
	"github.com/fencegate/fencegate/outbox"
)

// Kind is the intent kind the adapter serves.
const Kind = filekind.Name

// Defaults of Config.
const (
	DefaultDirMode      os.FileMode = 0o755
	DefaultFileMode     os.FileMode = 0o644
	DefaultHistoryLimit             = 256
)

// Sentinels callers may branch on with errors.Is. They always arrive wrapped
// in an *adapters.Error that is permanent.
var (
	// ErrOutsideRoot: the target leads out of Root (an absolute path, "..",
	// or a symbolic link pointing outside), or is itself a symbolic link.
	ErrOutsideRoot = errors.New("target outside the root")
	// ErrKeyConflict: the idempotency key was already published to the
	// target with different content.
	ErrKeyConflict = errors.New("idempotency key already published with different content")
	// ErrForeignResource: the target's fence belongs to another resource,
	// whose epochs are not comparable with the intent's.
	ErrForeignResource = errors.New("target fenced by another resource")
	// ErrBadPayload: the payload is not a valid file payload.
	ErrBadPayload = errors.New("invalid file payload")
)

// Config configures an Adapter.
type Config struct {
	// Root is the directory targets are published under. Required. It is
	// created (with DirMode) if missing; symbolic links in Root itself are
	// resolved once, by New.
	Root string
	// DirMode is the mode of directories created under Root. Default 0755.
	DirMode os.FileMode
	// FileMode is the mode of published files and manifests. Default 0644.
	FileMode os.FileMode
	// Allow restricts the targets published (--file-allow): path.Match
	// globs over the whole target ("reports/*.txt") or "dir/**" for
	// anything under dir. None: any target.
	Allow []string
	// AllowDotfiles lets a target have a segment starting with "." (the
	// adapter's own .<name>.fencegate.* names stay refused). Default: no.
	AllowDotfiles bool
	// MaxBytes is the largest content published to one target. Zero: no
	// limit of its own (the outbox's payload limit applies).
	MaxBytes int64
	// HistoryLimit is how many earlier publications of a target the
	// manifest remembers for Lookup, besides the current one. Default 256.
	HistoryLimit int
	// Logger receives the adapter's logs. Default: discarded.
	Logger *slog.Logger
	// Registerer receives the stale-epoch rejection counter
	// (where="file_destination"). Nil: not registered.
	Registerer prometheus.Registerer
	// Now is the clock stamped on publications. Default time.Now.
	Now func() time.Time
	// AfterRename, when set, is called after a publication's content was
	// renamed into place (and the directory fsynced) and before its
	// manifest is marked published and Execute returns. It exists for
	// fault tests only, which crash the process there; leave it nil.
	AfterRename func(target string)
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.DirMode = cmp.Or(c.DirMode, DefaultDirMode)
	c.FileMode = cmp.Or(c.FileMode, DefaultFileMode)
	c.HistoryLimit = cmp.Or(c.HistoryLimit, DefaultHistoryLimit)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate checks c, its defaults applied, creating nothing. An error is
// a *fenceerr.InvalidError naming the field (Root, FileMode, Allow, …).
func (c Config) Validate() error { return c.WithDefaults().validate() }

func (c Config) validate() error {
	switch {
	case c.Root == "":
		return fenceerr.Invalid("Root", "is required")
	case c.DirMode&^os.ModePerm != 0 || c.DirMode&0o700 != 0o700:
		return fenceerr.Invalid("DirMode", "%v must be permission bits including 0700", c.DirMode)
	case c.FileMode&^os.ModePerm != 0 || c.FileMode&0o600 != 0o600:
		return fenceerr.Invalid("FileMode", "%v must be permission bits including 0600", c.FileMode)
	case c.HistoryLimit < 0:
		return fenceerr.Invalid("HistoryLimit", "must not be negative, got %d", c.HistoryLimit)
	case c.MaxBytes < 0:
		return fenceerr.Invalid("MaxBytes", "must not be negative, got %d", c.MaxBytes)
	}
	return checkPatterns(c.Allow)
}

// Adapter publishes file intents under a root directory, fenced at the
// destination. It is safe for concurrent use, and several Adapters (in one
// process or many) may share a root.
type Adapter struct {
	cfg   Config
	stale prometheus.Counter
	root  string // Root, absolute with symbolic links resolved
	log   *slog.Logger
	// dirs shares directory fsyncs among concurrent publications into
	// one directory.
	dirs dirSyncer

	// Test hooks at the edge of the world (a disk that fails); nil in
	// production. writeHook replaces the write of staged content,
	// syncHook every file fsync, beforeRename runs just before the content
	// rename, afterResolve between the checks of a target's path and the
	// opening of its directory (a link swapped in there).
	writeHook    func(f *os.File, p []byte) error
	syncHook     func(f *os.File) error
	beforeRename func()
	afterResolve func()
}

var (
	_ adapters.Executor = (*Adapter)(nil)
	_ adapters.Looker   = (*Adapter)(nil)
)

// New returns an Adapter for cfg, creating cfg.Root if missing.
func New(cfg Config) (*Adapter, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("file adapter: root %q: %w", cfg.Root, err)
	}
	if err := os.MkdirAll(abs, cfg.DirMode); err != nil {
		return nil, fmt.Errorf("file adapter: create root: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("file adapter: resolve root: %w", err)
	}
	if fi, err := os.Stat(real); err != nil {
		return nil, fmt.Errorf("file adapter: root: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("file adapter: root %q is not a directory", real)
	}
	return &Adapter{cfg: cfg, root: real, log: cfg.Logger.With("component", "file_adapter"),
		stale: fencemetrics.StaleRejections(cfg.Registerer).WithLabelValues(fencemetrics.WhereFileDestination)}, nil
}

// Kind returns "file".
func (a *Adapter) Kind() string { return Kind }

// Registration is the adapter as gateway.Config.Adapters takes it: the
// file kind, its intake rules with the target policy (KindSpec: a target
// outside it is refused at enqueue, naming the field) and the adapter as
// its executor.
func (a *Adapter) Registration() adapters.Registration {
	return adapters.Registration{Kind: Kind, Spec: a.KindSpec(), Executor: a}
}

// Capabilities declares the destination's: the manifest answers Lookup.
func (a *Adapter) Capabilities() adapters.Capabilities { return adapters.Capabilities{Lookup: true} }

// Root returns the root directory, absolute with symbolic links resolved.
func (a *Adapter) Root() string { return a.root }

// Result is the JSON result of a succeeded file intent. It describes the
// publication as recorded at the destination, so a redelivered intent gets
// the same result as the attempt that published.
type Result struct {
	Path           string    `json:"path"`
	Epoch          int64     `json:"epoch"`
	SHA256         string    `json:"sha256"`
	Bytes          int64     `json:"bytes"`
	IntentID       int64     `json:"intent_id"`
	IdempotencyKey string    `json:"idempotency_key"`
	PublishedAt    time.Time `json:"published_at"`
}

// SupersededResult is the JSON result of a file intent the destination
// fenced out: a newer epoch was already accepted for the target.
type SupersededResult struct {
	Path            string `json:"path"`
	RejectedEpoch   int64  `json:"rejected_epoch"`
	CurrentEpoch    int64  `json:"current_epoch"`
	CurrentIntentID int64  `json:"current_intent_id"`
}

// decode checks req with filekind.Parse, the rules the outbox checked at
// enqueue (checked again: the adapter must not trust a row blindly), and
// returns the target and the content to publish. Every error is
// permanent; a target that would leave the root is ErrOutsideRoot, any
// other defect ErrBadPayload.
func (a *Adapter) decode(req adapters.Request, policy bool) (target string, content []byte, err error) {
	p, err := filekind.Parse(req.Payload)
	if err != nil {
		return "", nil, badPayload(p.Target, err)
	}
	// The target policy again at execute: an intent that reached the
	// outbox another way (a Go worker, SQL) is held to it too.
	if err := a.cfg.allowed(p.Target, len(p.Data())); policy && err != nil {
		return "", nil, adapters.PermanentError(fmt.Errorf("%w: %v", ErrNotAllowed, err))
	}
	if req.IdempotencyKey == "" {
		return "", nil, adapters.PermanentError(fmt.Errorf("%w: the intent has no idempotency key", ErrBadPayload))
	}
	return p.Target, p.Data(), nil
}

// checkTarget validates target with filekind.ValidateTarget: a target
// that would leave the root is ErrOutsideRoot, other defects
// ErrBadPayload; both permanent.
func checkTarget(target string) error {
	if err := filekind.ValidateTarget(target); err != nil {
		return badPayload(target, err)
	}
	return nil
}

func badPayload(target string, err error) error {
	if filekind.Escapes(target) {
		return adapters.PermanentError(fmt.Errorf("%w: %v", ErrOutsideRoot, err))
	}
	return adapters.PermanentError(fmt.Errorf("%w: %v", ErrBadPayload, err))
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func succeeded(p Publication) (adapters.Outcome, error) {
	res, err := json.Marshal(p.result())
	if err != nil {
		return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf("encode result: %w", err))
	}
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: res}, nil
}

// Execute publishes the intent's content to <Root>/<target> unless the
// destination fences it out.
//
// Outcomes: succeeded, with a Result, when the content was published now or
// when the intent's idempotency key was already published to the target
// with the same content (nothing is rewritten, also when the target was
// since removed or replaced by a directory or a symbolic link); superseded, with a
// SupersededResult, when a newer epoch was accepted for the target (nothing
// changes). Errors: permanent for bad payloads, targets outside the root,
// key conflicts and foreign resources; retryable for disk errors before the
// switch (nothing changed); unknown when the directory fsync after the
// switch failed.
func (a *Adapter) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	target, content, err := a.decode(req, true)
	if err != nil {
		return adapters.Outcome{}, err
	}
	if req.Epoch < 1 {
		return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf("%w: epoch must be at least 1, got %d", ErrBadPayload, req.Epoch))
	}
	if err := ctx.Err(); err != nil {
		return adapters.Outcome{}, adapters.RetryableError(err)
	}
	loc, err := a.open(target, true, true)
	if err != nil {
		return adapters.Outcome{}, err
	}
	defer loc.close()
	// A target replaced by a directory or a symbolic link (loc.replaced)
	// is refused, but only after its manifest was asked for the key: a
	// redelivery of a publication that happened before someone put it
	// there must be answered succeeded, not failed. Without a lock file
	// nothing was ever published there, and none is created for a target
	// that is refused anyway.
	unlock, err := loc.lock(ctx, loc.replaced == nil)
	if errors.Is(err, errNoTrace) {
		return adapters.Outcome{}, loc.replaced
	}
	if err != nil {
		return adapters.Outcome{}, err
	}
	// Everything below runs under the target's exclusive lock: the epoch
	// comparison and the switch are one atomic step at the destination,
	// never "read the epoch, then write unconditionally". The lock is
	// released when the function returns, or by the kernel when the
	// process dies.
	defer unlock()

	sum := sha256Hex(content)
	prev, hasPrev, err := loc.readManifest()
	if err != nil {
		return adapters.Outcome{}, err
	}
	prevApplied := false
	if hasPrev {
		if prevApplied, err = loc.applied(prev); err != nil {
			return adapters.Outcome{}, err
		}
		// The key is looked up before the epoch is compared: a key that
		// was published is a success even after a newer epoch took over
		// (the effect happened; the redelivery must record it, not call
		// it superseded).
		if pub, ok := prev.find(req.IdempotencyKey, prevApplied); ok {
			if pub.SHA256 != sum {
				return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf(
					"%w: key %q was published to %q by intent %d with sha256 %s, this intent's content has sha256 %s",
					ErrKeyConflict, req.IdempotencyKey, target, pub.IntentID, pub.SHA256, sum))
			}
			if prev.State == StatePending && pub.IdempotencyKey == prev.IdempotencyKey {
				// An earlier attempt crashed after its rename and before
				// marking the manifest: record what the content proves.
				// Best effort; the content's sha proves it either way.
				prev.State = StatePublished
				if err := loc.markManifest(prev); err != nil {
					a.log.Warn("mark recovered publication", "target", target, "err", err)
				}
			}
			a.log.Info("already published", "target", target, "intent_id", req.IntentID,
				"idempotency_key", req.IdempotencyKey, "published_by", pub.IntentID)
			return succeeded(pub)
		}
	}
	if loc.replaced != nil {
		return adapters.Outcome{}, loc.replaced
	}
	if hasPrev {
		if prev.Resource != req.Resource {
			return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf(
				"%w: %q is fenced by resource %q; epochs of resource %q are not comparable",
				ErrForeignResource, target, prev.Resource, req.Resource))
		}
		if req.Epoch < prev.Epoch {
			a.stale.Inc()
			a.log.Info("superseded", "target", target, "intent_id", req.IntentID,
				"rejected_epoch", req.Epoch, "current_epoch", prev.Epoch)
			res, err := json.Marshal(SupersededResult{
				Path: target, RejectedEpoch: req.Epoch, CurrentEpoch: prev.Epoch, CurrentIntentID: prev.IntentID,
			})
			if err != nil {
				return adapters.Outcome{}, adapters.PermanentError(err)
			}
			return adapters.Outcome{Status: outbox.StatusSuperseded, Result: res}, nil
		}
	}

	pub := Publication{
		Target:         target,
		Epoch:          req.Epoch,
		IntentID:       req.IntentID,
		IdempotencyKey: req.IdempotencyKey,
		SHA256:         sum,
		Bytes:          int64(len(content)),
		PublishedAt:    a.cfg.Now().UTC().Truncate(time.Microsecond),
	}
	next := Manifest{
		Version:     manifestVersion,
		Resource:    req.Resource,
		Publication: pub,
		State:       StatePending,
		History:     prev.nextHistory(hasPrev && prevApplied, a.cfg.HistoryLimit),
	}

	// Crash-order choice: write-ahead manifest, then rename, then mark.
	//
	//  1. Stage: write and fsync the content to the staged file. A crash
	//     here leaves only the staged file, overwritten by the next
	//     publisher (who holds the lock, so nobody else is staging).
	//  2. Write the manifest with the new epoch, key and sha, state
	//     "pending" (temp file, fsync, rename, directory fsync). From here
	//     on the epoch is durably raised: an older epoch is rejected even
	//     if we crash before the content moves — and rightly so, since this
	//     epoch was accepted. A crash here leaves a pending entry whose sha
	//     does not match the file: Lookup says not found, the redelivery
	//     publishes (its epoch is equal, so it passes), and the next
	//     publisher drops the entry as never applied.
	//  3. Rename the staged file over the target and fsync the directory:
	//     the commit point. A crash after it leaves a pending entry whose
	//     sha matches the file, which Lookup, Execute and the next
	//     publisher all treat as published — the publication's identity was
	//     written in step 2, so it is never lost, and the epoch was raised
	//     before the content changed, so no older epoch can slip in.
	//  4. Mark the manifest "published". Only a shortcut: the sha check of
	//     step 3 proves the same, so a failure here is logged, not returned,
	//     and the directory is not fsynced for it (markManifest): a crash
	//     that loses the mark leaves the pending manifest of step 3.
	//
	// The opposite order (content first, manifest after) would let a crash
	// in between leave epoch 34's content under a manifest still saying 33,
	// and a late epoch-33 writer would then pass the check and overwrite.
	//
	// Every "directory fsync" above may be shared with concurrent
	// publications into the same directory (location.syncDir): each step
	// still waits, at the same point, for an fsync of the directory that
	// started after its rename, which is what an fsync of its own gives;
	// dirSyncer has the argument.
	if err := loc.stage(content); err != nil {
		return adapters.Outcome{}, err
	}
	if err := loc.writeManifest(next); err != nil {
		loc.removeStaged()
		return adapters.Outcome{}, err
	}
	if a.beforeRename != nil {
		a.beforeRename()
	}
	// The commit point is next: re-validate that this attempt still owns
	// its idempotency key. If not, stop here — as a crash here would: the
	// pending manifest entry does not match the file, so Lookup says not
	// found and the next publisher drops it — and report that nothing
	// happened.
	if err := req.StillOwner(ctx); err != nil {
		loc.removeStaged()
		return adapters.Outcome{}, adapters.RetryableError(fmt.Errorf("not publishing %q: %w", target, err))
	}
	if err := loc.dir.Rename(loc.stagedName(), loc.name); err != nil {
		loc.removeStaged()
		return adapters.Outcome{}, classify("rename staged file into place", err)
	}
	if err := loc.syncDir(); err != nil {
		// The rename happened in the kernel but may not survive a power
		// failure: whether the publication stands is unknown. Lookup
		// answers it from the file's sha.
		return adapters.Outcome{}, adapters.UnknownError(fmt.Errorf("fsync directory after publishing %q: %w", target, err))
	}
	if a.cfg.AfterRename != nil {
		a.cfg.AfterRename(target)
	}
	failpoint.Inject(failpoint.AfterRenameBeforeRecord) // no-op unless built with -tags failpoints
	next.State = StatePublished
	if err := loc.markManifest(next); err != nil {
		a.log.Warn("mark manifest published (the content sha still proves it)", "target", target, "err", err)
	}
	a.log.Info("published", "target", target, "epoch", req.Epoch, "intent_id", req.IntentID,
		"idempotency_key", req.IdempotencyKey, "bytes", pub.Bytes)
	return succeeded(pub)
}

// Lookup reports whether req's idempotency key was already published to
// its target with the same content: found, with the recorded Result, also
// when newer epochs were published since (within Config.HistoryLimit).
// found=false when the destination has no trace of it, including when the
// key was published with different content, and when the payload is
// invalid or its target leads out of the root — nothing can have been
// published for those — so that Execute runs and reports the permanent
// error. Errors are left for what prevents an answer: disk errors and a
// missing root (retryable) and a corrupt manifest (permanent). Lookup
// creates nothing at the destination.
func (a *Adapter) Lookup(ctx context.Context, req adapters.Request) (adapters.Outcome, bool, error) {
	// Without the target policy: a lookup reads, and an effect made before
	// the policy was tightened is still found.
	target, content, err := a.decode(req, false)
	if err != nil {
		return adapters.Outcome{}, false, nil
	}
	m, ok, err := a.published(ctx, target)
	if errors.Is(err, ErrOutsideRoot) || errors.Is(err, ErrBadPayload) {
		return adapters.Outcome{}, false, nil
	}
	if err != nil || !ok {
		return adapters.Outcome{}, false, err
	}
	pub, ok := m.find(req.IdempotencyKey, m.State == StatePublished)
	if !ok {
		return adapters.Outcome{}, false, nil
	}
	if sum := sha256Hex(content); pub.SHA256 != sum {
		a.log.Warn("key published with different content", "target", target,
			"idempotency_key", req.IdempotencyKey, "published_sha256", pub.SHA256, "sha256", sum)
		return adapters.Outcome{}, false, nil
	}
	out, err := succeeded(pub)
	return out, err == nil, err
}

// Published returns the manifest of target, and false when nothing was ever
// published there. A pending current publication whose content is in place
// (a crash after the rename) is reported as published; one whose content
// is not (a crash before it) stays pending: its epoch is accepted, its
// content is not there. For tests and checkers.
func (a *Adapter) Published(target string) (Manifest, bool, error) {
	if err := checkTarget(target); err != nil {
		return Manifest{}, false, err
	}
	return a.published(context.Background(), target)
}

// published reads target's manifest under its lock, resolving a pending
// current publication against the file's content.
func (a *Adapter) published(ctx context.Context, target string) (Manifest, bool, error) {
	// A missing root is a destination that is not there (a volume not
	// mounted, a root moved away), not one without a trace of the target:
	// "nothing published" from it would be trusted as proof, and the
	// intent executed again, into a missing root, until it failed — while
	// its publication is back with the volume. Say that it cannot answer.
	if _, err := os.Stat(a.root); err != nil {
		return Manifest{}, false, classify("the root "+a.root, err)
	}
	loc, err := a.open(target, false, false)
	if errors.Is(err, errNoTrace) {
		return Manifest{}, false, nil
	}
	if err != nil {
		return Manifest{}, false, err
	}
	defer loc.close()
	// Under the lock, so the manifest and the file are read as one state:
	// without it a publisher could switch both between the two reads.
	unlock, err := loc.lock(ctx, false)
	if errors.Is(err, errNoTrace) {
		return Manifest{}, false, nil
	}
	if err != nil {
		return Manifest{}, false, err
	}
	defer unlock()
	m, ok, err := loc.readManifest()
	if err != nil || !ok {
		return Manifest{}, false, err
	}
	if m.State == StatePending {
		applied, err := loc.applied(m)
		if err != nil {
			return Manifest{}, false, err
		}
		if applied {
			m.State = StatePublished
		}
	}
	return m, true, nil
}
