package file

import (
	"os"
	"sync"
)

// dirSyncer shares directory fsyncs among concurrent publications into one
// directory (the targets of one directory are different files with
// different locks, so they publish at once).
//
// The rule that keeps every crash order of Execute true: a caller that
// needs the directory fsynced after its rename returns only once an fsync
// of the directory that *started after the caller arrived* (so after its
// rename, which returned before it called) has completed without error.
// An fsync of a directory makes durable every change to its entries made
// before the fsync started, by whichever file descriptor and process, so
// that fsync gives the caller exactly what an fsync of its own would:
//
//   - Each caller still waits at the same point of its own order (manifest
//     renamed, then the directory durable, then the content renamed, then
//     the directory durable, then the mark): nothing of its order moves,
//     it only may not have to issue the fsync itself.
//   - An fsync already running when a caller arrives may have started
//     before the caller's rename, so it never counts for that caller: the
//     caller waits for it to end and for the next one, which it (or
//     another caller that arrived meanwhile) starts.
//   - Sharing can make another publication's rename durable sooner than
//     its own fsync would; that rename was already issued, after that
//     publication's own preconditions (staged content fsynced, manifest
//     ahead), and the kernel may write a directory back at any moment
//     anyway, so no order of any publication depends on a rename staying
//     volatile.
//   - A failed fsync fails every caller it served, each then handling the
//     error as its own fsync's (retryable before the content rename,
//     unknown after it); and, conservatively, a caller served earlier that
//     only looks after the failure. A later fsync succeeding is never
//     taken as proof for a caller whose serving fsync failed.
//
// One fsync per directory runs at a time; the callers that arrive while it
// runs share the next one.
type dirSyncer struct {
	mu sync.Mutex
	m  map[string]*dirSync // by directory identity (device:inode)
}

// dirSync is the state of one directory's fsyncs. Its counters only grow.
type dirSync struct {
	mu       sync.Mutex
	cond     *sync.Cond
	refs     int    // callers using the entry (under dirSyncer.mu)
	started  uint64 // fsyncs started
	finished uint64 // fsyncs finished; one runs at a time, so in order
	running  bool
	failed   uint64 // the latest fsync that failed (0: none)
	err      error  // its error
	parked   int    // callers waiting for someone else's fsync (tests)
}

// sync returns once an fsync of the directory (dir, whose identity is
// key) that started after the call has completed, running it itself (with
// syncFn) unless another caller's fsync serves.
func (s *dirSyncer) sync(key string, dir *os.File, syncFn func(*os.File) error) error {
	d := s.acquire(key)
	defer s.release(key, d)

	d.mu.Lock()
	defer d.mu.Unlock()
	// The first fsync that can serve us is the next one to start: one
	// running now may have started before our rename.
	need := d.started + 1
	for d.finished < need {
		if d.running {
			d.parked++
			d.cond.Wait()
			d.parked--
			continue
		}
		d.running = true
		d.started++
		gen := d.started
		d.mu.Unlock()
		err := syncFn(dir)
		d.mu.Lock()
		d.running = false
		d.finished = gen
		if err != nil {
			d.failed, d.err = gen, err
		}
		d.cond.Broadcast()
	}
	if d.failed >= need {
		return d.err
	}
	return nil
}

func (s *dirSyncer) acquire(key string) *dirSync {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string]*dirSync)
	}
	d := s.m[key]
	if d == nil {
		d = &dirSync{}
		d.cond = sync.NewCond(&d.mu)
		s.m[key] = d
	}
	d.refs++
	return d
}

func (s *dirSyncer) release(key string, d *dirSync) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.refs--; d.refs == 0 {
		delete(s.m, key)
	}
}

// parked returns how many callers wait for another caller's fsync of the
// directory key (for tests).
func (s *dirSyncer) parked(key string) int {
	s.mu.Lock()
	d := s.m[key]
	s.mu.Unlock()
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.parked
}
