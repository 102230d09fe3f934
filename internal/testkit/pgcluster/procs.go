package pgcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// killWait bounds each step of killServer: freezing the processes, and
// their exit after SIGKILL.
const killWait = 10 * time.Second

// killServer SIGKILLs every process of the server and returns once none is
// left: the postmaster (pm, nil when it already exited), the processes it
// forked, theirs, and any process of the postgres program whose working
// directory is the data directory (the postmaster changes into it and every
// process it forks inherits it, so that also finds one whose parent already
// died and left it to init). A process of the old server left running stays attached to its
// shared memory block, and the next start refuses to run ("pre-existing
// shared memory block … is still in use") for as long as it lives: one
// blocked on a lock a killed process held lives until its stuck-spinlock
// timeout, or for ever.
//
// Each backend calls setsid() at start, so a kill of the postmaster's
// process group misses it; and the postmaster keeps forking (a backend per
// connection, parallel workers, autovacuum workers) until it is stopped, so
// a list of its children taken before the kill misses those forked after.
// Hence: SIGSTOP first, and find the processes while they are stopped. A
// stopped process forks nothing, and a child of a stopped parent that exits
// stays a zombie, its process id not reused, until the parent is killed:
// once every process found is stopped and a scan of /proc finds no new one,
// the set is complete and every id in it is safe to kill.
func (c *Cluster) killServer(pm *os.Process, done <-chan struct{}) error {
	dataDir, err := filepath.EvalSymlinks(c.dataDir)
	if err != nil {
		dataDir = c.dataDir
	}
	postgres, err := filepath.EvalSymlinks(filepath.Join(c.bin, "postgres"))
	if err != nil {
		postgres = filepath.Join(c.bin, "postgres")
	}
	self := os.Getpid()
	found := map[int]uint64{} // process id → start time (/proc/<pid>/stat)
	root := 0
	if pm != nil && pm.Signal(syscall.SIGSTOP) == nil {
		root = pm.Pid
		if st, ok := procStat(root); ok {
			found[root] = st.start
		}
	}
	// 1. Freeze: stop every process found, until all are stopped and a
	//    scan taken after that finds no new one.
	deadline := time.Now().Add(killWait)
	for {
		frozen := true
		for pid, start := range found {
			if st, ok := procStat(pid); ok && st.start == start && !st.stopped() {
				frozen = false
			}
		}
		added := false
		scanProcs(func(pid int, st procInfo) {
			if pid == self {
				return
			}
			if _, ok := found[pid]; ok {
				return
			}
			if _, child := found[st.ppid]; !child && !isServer(pid, postgres, dataDir) {
				return
			}
			_ = syscall.Kill(pid, syscall.SIGSTOP)
			found[pid] = st.start
			added = true
		})
		if frozen && !added {
			break
		}
		if time.Now().After(deadline) {
			break // kill what was found; the wait below names any survivor
		}
		time.Sleep(time.Millisecond)
	}
	// 2. Kill: the children while the postmaster is stopped (their ids
	//    cannot be reused before it is killed and they are reaped), then
	//    the postmaster.
	for pid, start := range found {
		if pid == root {
			continue
		}
		if st, ok := procStat(pid); ok && st.start == start {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if root != 0 {
		_ = pm.Signal(syscall.SIGKILL)
	}
	// 3. Wait until every one has exited: a zombie has released its memory,
	//    shared memory included.
	select {
	case <-done:
	case <-time.After(killWait):
		return fmt.Errorf("pgcluster: postmaster %d did not exit %s after SIGKILL", root, killWait)
	}
	deadline = time.Now().Add(killWait)
	for {
		var alive []string
		for pid, start := range found {
			if st, ok := procStat(pid); ok && st.start == start && st.state != "Z" && st.state != "X" {
				alive = append(alive, fmt.Sprintf("%d (%s)", pid, st.state))
			}
		}
		if len(alive) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: processes of the killed server still running %s after SIGKILL: %s", killWait, strings.Join(alive, ", "))
		}
		time.Sleep(time.Millisecond)
	}
}

// procInfo is what killServer reads of a process in /proc/<pid>/stat.
type procInfo struct {
	ppid  int
	state string
	// start is the start time in clock ticks after boot: it tells a process
	// from a later one given the same id.
	start uint64
}

// stopped reports whether the process can fork no more: stopped by a
// signal or a tracer, or exited.
func (p procInfo) stopped() bool {
	switch p.state {
	case "T", "t", "Z", "X":
		return true
	}
	return false
}

// procStat reads a process's parent id, state and start time from
// /proc/<pid>/stat (Linux).
func procStat(pid int) (procInfo, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	// pid (comm) state ppid …: comm may hold spaces and parentheses. After
	// it, field 3 (state) is f[0], field 4 (ppid) f[1], field 22
	// (starttime) f[19].
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(string(b)[i+1:])
	if len(f) < 20 {
		return procInfo{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return procInfo{}, false
	}
	return procInfo{ppid: ppid, state: f[0], start: start}, true
}

// scanProcs calls fn for every process in /proc.
func scanProcs(fn func(pid int, st procInfo)) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := procStat(pid); ok {
			fn(pid, st)
		}
	}
}

// isServer reports whether process pid runs the program postgres in the
// directory dataDir: a process of that server, whatever its parent (a shell
// an operator left in the directory is not one). A process of another
// user, unreadable, is not.
func isServer(pid int, postgres, dataDir string) bool {
	dir := "/proc/" + strconv.Itoa(pid)
	cwd, err := os.Readlink(dir + "/cwd")
	if err != nil || cwd != dataDir {
		return false
	}
	exe, err := os.Readlink(dir + "/exe")
	return err == nil && exe == postgres
}

// leftovers returns the live (not zombie) processes of a server of this
// data directory.
func (c *Cluster) leftovers() []int {
	dataDir, err := filepath.EvalSymlinks(c.dataDir)
	if err != nil {
		return nil
	}
	postgres, err := filepath.EvalSymlinks(filepath.Join(c.bin, "postgres"))
	if err != nil {
		return nil
	}
	var pids []int
	scanProcs(func(pid int, st procInfo) {
		if st.state != "Z" && st.state != "X" && isServer(pid, postgres, dataDir) {
			pids = append(pids, pid)
		}
	})
	return pids
}
