package file

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/kinds/filekind"
)

// errNoTrace says a read-only open found no directory, lock file or
// manifest: nothing was ever published to the target.
var errNoTrace = errors.New("nothing published to the target")

// Suffixes of the hidden files kept beside a target (see the package doc).
const (
	manifestSuffix = ".fencegate.json"
	lockSuffix     = ".fencegate.lock"
	stagedSuffix   = ".fencegate.staged"
	tmpSuffix      = ".tmp"
)

// reserved reports whether a path segment has the shape of the adapter's
// own hidden files, which a target may not use.
func reserved(seg string) bool {
	return filekind.Reserved(seg)
}

// location is an opened target: its directory, held by file descriptor so
// that later operations cannot be redirected by a symbolic link swapped in
// after the checks, and the target's name in it.
type location struct {
	a      *Adapter
	target string
	dir    *os.Root // the target's directory
	dirf   *os.File // the same directory, for fsync and identity
	name   string
	key    string // identity of the target: device, inode of dir, name
	dirKey string // identity of the directory: device, inode
	// replaced is the permanent refusal of a target that exists and is
	// not a regular file (a directory, a symbolic link, …), or nil. open
	// does not fail on it: its manifest and lock beside it are still the
	// destination's record, and a key published there before someone put
	// the directory or link in its place must still be found (Lookup,
	// Execute) rather than taken for one that never was.
	replaced error
}

func (l *location) manifestName() string { return "." + l.name + manifestSuffix }
func (l *location) lockName() string     { return "." + l.name + lockSuffix }
func (l *location) stagedName() string   { return "." + l.name + stagedSuffix }

func (l *location) close() {
	l.dirf.Close()
	l.dir.Close()
}

// outside wraps a reason as a permanent ErrOutsideRoot naming the
// payload's field.
func outside(target, format string, args ...any) error {
	return adapters.PermanentError(fmt.Errorf("%w: payload.target: %q: %s", ErrOutsideRoot, target, fmt.Sprintf(format, args...)))
}

// within reports whether the absolute, resolved path p is a.root or below.
func (a *Adapter) within(p string) bool {
	rel, err := filepath.Rel(a.root, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}

// open checks target and opens its directory, creating missing directories
// when create is set; without create a missing directory is errNoTrace.
// With policy set, the path the target resolves to must pass the target
// policy (Config.Allow, dotfiles) as the logical target did: a directory
// of an allowed tree that is a symbolic link into another tree lets
// nothing through.
//
// Containment is checked twice. First by hand, component by component:
// each existing directory component that is a symbolic link is resolved
// and must land inside the root (else a permanent ErrOutsideRoot naming
// it); the result is a relative path free of symbolic links, which the
// policy judges. Then the directory is opened from the root one component
// of that path at a time (openDir), each checked to be the real directory
// it was, so that the directory written in is the one judged even if a
// link is swapped in after the checks; and every operation goes through
// os.Root, which refuses any path that leaves the root (such an error is
// classified permanent).
func (a *Adapter) open(target string, create, policy bool) (*location, error) {
	if err := checkTarget(target); err != nil {
		return nil, err
	}
	segs := strings.Split(target, "/")
	for _, s := range segs {
		if reserved(s) {
			return nil, adapters.PermanentError(fmt.Errorf("%w: target %q: %q is reserved for the adapter's own files (.<name>.fencegate.*)", ErrBadPayload, target, s))
		}
	}
	name := segs[len(segs)-1]
	rel, missing, err := a.resolveDir(target, segs[:len(segs)-1])
	if err != nil {
		return nil, err
	}
	if policy {
		resolved := path.Join(filepath.ToSlash(rel), path.Join(missing...), name)
		if err := a.cfg.allowedTarget(resolved); err != nil {
			return nil, adapters.PermanentError(fmt.Errorf("%w: %q resolves to %q (symbolic links followed): %v", ErrNotAllowed, target, resolved, err))
		}
	}
	if len(missing) > 0 && !create {
		return nil, errNoTrace
	}
	if a.afterResolve != nil {
		a.afterResolve()
	}
	var comps []string
	if rel != "." {
		comps = strings.Split(rel, string(filepath.Separator))
	}
	dir, err := a.openDir(target, comps, missing)
	if err != nil {
		if !create && errors.Is(err, fs.ErrNotExist) {
			return nil, errNoTrace
		}
		return nil, err
	}
	dirf, err := dir.Open(".")
	if err != nil {
		dir.Close()
		return nil, classify("open directory of "+target, err)
	}
	l := &location{a: a, target: target, dir: dir, dirf: dirf, name: name}
	fi, err := dirf.Stat()
	if err != nil {
		l.close()
		return nil, classify("stat directory of "+target, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		l.close()
		return nil, adapters.PermanentError(errors.New("file adapter: no device and inode numbers on this platform"))
	}
	// The lock and the manifest live in the real directory, so every
	// spelling of the target shares one fence; the key that serialises
	// goroutines in this process is that directory's identity.
	l.dirKey = fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	l.key = l.dirKey + "/" + name

	// A target that is a symbolic link or not a regular file is refused
	// (l.replaced), but only by the caller, after it read the manifest:
	// what was published there is still on record.
	fi, err = dir.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		l.close()
		return nil, classify("stat "+target, err)
	case fi.Mode()&os.ModeSymlink != 0:
		if real, err := filepath.EvalSymlinks(filepath.Join(a.root, rel, path.Join(missing...), name)); err != nil || !a.within(real) {
			l.replaced = outside(target, "it is a symbolic link leading out of the root")
		} else {
			l.replaced = outside(target, "it is a symbolic link; only regular files are published")
		}
	case !fi.Mode().IsRegular():
		l.replaced = adapters.PermanentError(fmt.Errorf("%w: target %q exists and is not a regular file (%v)", ErrBadPayload, target, fi.Mode().Type()))
	}
	return l, nil
}

// openDir opens, from the root, the directory whose existing components
// resolveDir found free of symbolic links (existing) followed by the ones
// it found missing, creating those. Each component is opened from the one
// before by file descriptor and must be the real directory that a
// look-up of its name (not following links) saw just before: had a
// symbolic link been swapped in since the checks, the open fails
// (retryable: the next attempt resolves the link and judges where it
// leads) instead of following it. So the directory returned was, when
// opened, at the very path the checks judged.
func (a *Adapter) openDir(target string, existing, missing []string) (*os.Root, error) {
	cur, err := os.OpenRoot(a.root)
	if err != nil {
		return nil, classify("open root", err)
	}
	step := func(s string) error {
		fi, err := cur.Lstat(s)
		if err != nil {
			return classify("stat directory "+s+" of "+target, err)
		}
		if !fi.IsDir() {
			return adapters.RetryableError(fmt.Errorf("directory %q of %q changed while being opened (now %v)", s, target, fi.Mode().Type()))
		}
		next, err := cur.OpenRoot(s)
		if err != nil {
			return classify("open directory "+s+" of "+target, err)
		}
		nfi, err := next.Stat(".")
		if err != nil {
			next.Close()
			return classify("stat directory "+s+" of "+target, err)
		}
		if !os.SameFile(fi, nfi) {
			next.Close()
			return adapters.RetryableError(fmt.Errorf("directory %q of %q changed while being opened", s, target))
		}
		cur.Close()
		cur = next
		return nil
	}
	for _, s := range existing {
		if err := step(s); err != nil {
			cur.Close()
			return nil, err
		}
	}
	for _, s := range missing {
		err := cur.Mkdir(s, a.cfg.DirMode)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			cur.Close()
			return nil, classify("create directory "+s+" of "+target, err)
		}
		if err == nil {
			// The new entry must survive a crash before the file in it is
			// published: fsync the parent that holds it. (One made
			// concurrently is synced by its maker.)
			pf, err := cur.Open(".")
			if err == nil {
				err = a.sync(pf)
				pf.Close()
			}
			if err != nil {
				cur.Close()
				return nil, classify("fsync the parent of directory "+s+" of "+target, err)
			}
		}
		if err := step(s); err != nil {
			cur.Close()
			return nil, err
		}
	}
	return cur, nil
}

// resolveDir walks the directory components dirSegs of target from the
// root. It returns the existing part as a path relative to the root with
// every symbolic link resolved, and the components that do not exist yet.
func (a *Adapter) resolveDir(target string, dirSegs []string) (rel string, missing []string, err error) {
	cur := a.root // always a resolved path inside the root
	for i, s := range dirSegs {
		p := filepath.Join(cur, s)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			missing = dirSegs[i:]
			break
		}
		if err != nil {
			return "", nil, classify("stat "+p, err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			real, err := filepath.EvalSymlinks(p)
			if errors.Is(err, fs.ErrNotExist) {
				return "", nil, outside(target, "directory %q is a dangling symbolic link", s)
			}
			if err != nil {
				return "", nil, classify("resolve "+p, err)
			}
			if !a.within(real) {
				return "", nil, outside(target, "directory %q is a symbolic link leading out of the root", s)
			}
			if fi, err = os.Stat(real); err != nil {
				return "", nil, classify("stat "+real, err)
			}
			p = real
		}
		if !fi.IsDir() {
			return "", nil, adapters.PermanentError(fmt.Errorf("%w: target %q: %q is not a directory", ErrBadPayload, target, s))
		}
		cur = p
	}
	rel, err = filepath.Rel(a.root, cur)
	if err != nil {
		return "", nil, adapters.PermanentError(err)
	}
	return rel, missing, nil
}

// procLocks serialises, per target, the goroutines of this process (of all
// Adapters) before they take the flock; flock then serialises processes.
// It keeps the wait cancellable without polling among local goroutines.
var procLocks = keyedMutex{m: make(map[string]*keyedEntry)}

type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	ch   chan struct{}
	refs int
}

func (k *keyedMutex) lock(ctx context.Context, key string) (release func(), err error) {
	k.mu.Lock()
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{ch: make(chan struct{}, 1)}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	drop := func() {
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case e.ch <- struct{}{}:
		return func() { <-e.ch; drop() }, nil
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}

// lock takes the target's exclusive lock: this process's keyed mutex, then
// flock(LOCK_EX) on the lock file, which the kernel releases if the
// process dies. Without create, a missing lock file is errNoTrace.
func (l *location) lock(ctx context.Context, create bool) (unlock func(), err error) {
	release, err := procLocks.lock(ctx, l.key)
	if err != nil {
		return nil, adapters.RetryableError(fmt.Errorf("wait for lock of %q: %w", l.target, err))
	}
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	f, err := l.dir.OpenFile(l.lockName(), flags, l.a.cfg.FileMode)
	if err != nil {
		release()
		if !create && errors.Is(err, fs.ErrNotExist) {
			return nil, errNoTrace
		}
		return nil, classify("open lock file of "+l.target, err)
	}
	if err := flock(ctx, f); err != nil {
		f.Close()
		release()
		return nil, classify("lock "+l.target, err)
	}
	return func() {
		f.Close() // releases the flock
		release()
	}, nil
}

// flock takes an exclusive flock on f, polling so that ctx can end the
// wait (only other processes contend here; see procLocks).
func flock(ctx context.Context, f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	delay := time.Millisecond
	for {
		var ferr error
		if err := rc.Control(func(fd uintptr) {
			ferr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB)
		}); err != nil {
			return err
		}
		if ferr == nil {
			return nil
		}
		if !errors.Is(ferr, syscall.EWOULDBLOCK) && !errors.Is(ferr, syscall.EINTR) {
			return ferr
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// readManifest reads the target's manifest; false when there is none.
func (l *location) readManifest() (Manifest, bool, error) {
	data, err := l.dir.ReadFile(l.manifestName())
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, false, nil
	}
	if err != nil {
		return Manifest{}, false, classify("read manifest of "+l.target, err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		// Written only by atomic rename, so this is outside interference:
		// refuse to guess the fence; an operator must repair it.
		return Manifest{}, false, adapters.PermanentError(fmt.Errorf("manifest of %q is corrupt: %w", l.target, err))
	}
	if m.Version != manifestVersion {
		return Manifest{}, false, adapters.PermanentError(fmt.Errorf("manifest of %q has version %d, want %d", l.target, m.Version, manifestVersion))
	}
	return m, true, nil
}

// applied reports whether m's current publication is in place: marked
// published, or pending with the target's content matching its sha256 (a
// crash between the rename and the marking).
func (l *location) applied(m Manifest) (bool, error) {
	if m.State == StatePublished {
		return true, nil
	}
	// Only a regular file at the target's own name proves it: the content
	// a symbolic link leads to was not renamed there by the publication
	// (os.Root would follow a link inside the root), and a directory holds
	// no content.
	lfi, err := l.dir.Lstat(l.name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, classify("stat "+l.target, err)
	}
	if !lfi.Mode().IsRegular() {
		return false, nil
	}
	f, err := l.dir.Open(l.name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, classify("open "+l.target, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, classify("stat "+l.target, err)
	}
	if !os.SameFile(lfi, fi) || fi.Size() != m.Bytes {
		return false, nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false, classify("read "+l.target, err)
	}
	return hex.EncodeToString(h.Sum(nil)) == m.SHA256, nil
}

// writeSynced creates name (replacing a leftover of a crashed holder of the
// lock), writes data with write, fsyncs and closes it; on failure it
// removes it. Removing first and creating with O_EXCL means a symbolic
// link planted under the name is replaced, never followed.
func (l *location) writeSynced(name string, data []byte, write func(*os.File, []byte) error) error {
	if err := l.dir.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return classify("remove leftover "+name, err)
	}
	f, err := l.dir.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, l.a.cfg.FileMode)
	if err != nil {
		return classify("create "+name, err)
	}
	err = f.Chmod(l.a.cfg.FileMode) // the exact mode, whatever the umask
	if err == nil {
		if write != nil {
			err = write(f, data)
		} else {
			_, err = f.Write(data)
		}
	}
	if err == nil {
		err = l.a.sync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = l.dir.Remove(name)
		return classify("write "+name, err)
	}
	return nil
}

// stage writes content to the staged file, fsynced.
func (l *location) stage(content []byte) error {
	return l.writeSynced(l.stagedName(), content, l.a.writeHook)
}

func (l *location) removeStaged() { _ = l.dir.Remove(l.stagedName()) }

// writeManifest replaces the manifest atomically: temp file, fsync,
// rename, directory fsync.
func (l *location) writeManifest(m Manifest) error { return l.replaceManifest(m, true) }

// markManifest replaces the manifest atomically like writeManifest but
// does not wait for the directory fsync: for a change that is only a
// shortcut (marking a publication "published" whose content already
// proves it by its sha). The temp file is still fsynced before the rename,
// so a crash leaves either the old manifest or the new one, whole, never
// an empty or torn one; either is right, and the next directory fsync (the
// next publication's in this directory) makes the new one durable.
func (l *location) markManifest(m Manifest) error { return l.replaceManifest(m, false) }

func (l *location) replaceManifest(m Manifest, syncDir bool) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return adapters.PermanentError(fmt.Errorf("encode manifest: %w", err))
	}
	data = append(data, '\n')
	tmp := l.manifestName() + tmpSuffix
	if err := l.writeSynced(tmp, data, nil); err != nil {
		return err
	}
	if err := l.dir.Rename(tmp, l.manifestName()); err != nil {
		_ = l.dir.Remove(tmp)
		return classify("rename manifest of "+l.target, err)
	}
	if !syncDir {
		return nil
	}
	if err := l.syncDir(); err != nil {
		return classify("fsync directory of "+l.target, err)
	}
	return nil
}

// syncDir returns once the target's directory was fsynced by an fsync that
// started after the call, so after the caller's rename: the caller's own,
// or one shared with concurrent publications into the same directory (see
// dirSyncer for why sharing keeps every crash order).
func (l *location) syncDir() error { return l.a.dirs.sync(l.dirKey, l.dirf, l.a.sync) }

func (a *Adapter) sync(f *os.File) error {
	if a.syncHook != nil {
		return a.syncHook(f)
	}
	return f.Sync()
}

// classify wraps a file-system error with its retry class:
//
//   - permanent when the target itself is unusable and retrying cannot
//     help: ENOTDIR, EISDIR, ENAMETOOLONG, ELOOP, EINVAL; and errors that
//     carry no errno, chiefly os.Root's refusal of a path that escapes the
//     root (a symbolic link swapped in after the checks);
//   - retryable otherwise, nothing having changed: ENOSPC, EDQUOT, EIO,
//     EROFS, and also EACCES/EPERM — a permission problem at the
//     destination is an operator's to fix (the adapter usually runs as a
//     service user), and the intent should wait for it, not fail; as well
//     as a cancelled or expired context.
func classify(op string, err error) error {
	wrapped := fmt.Errorf("%s: %w", op, err)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return adapters.RetryableError(wrapped)
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return adapters.PermanentError(wrapped)
	}
	switch errno {
	case syscall.ENOTDIR, syscall.EISDIR, syscall.ENAMETOOLONG, syscall.ELOOP, syscall.EINVAL:
		return adapters.PermanentError(wrapped)
	}
	return adapters.RetryableError(wrapped)
}
