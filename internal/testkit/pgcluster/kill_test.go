package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A killed server leaves no process behind, however busy it was and however
// fast the kills come: Kill returns only when every process of the old
// server is gone, so StartAgain succeeds at once. The server is killed three
// times in quick succession while clients run parallel queries (parallel
// workers are background workers the postmaster forks on demand) and others
// connect and disconnect without pause (a backend forked per connection), so
// the postmaster is forking while it is killed.
func TestKillBusyServerLeavesNoProcess(t *testing.T) {
	ctx := context.Background()
	c, err := Start(ctx, Options{Settings: map[string]string{
		"max_worker_processes":            "16",
		"max_parallel_workers":            "16",
		"max_parallel_workers_per_gather": "4",
		"parallel_setup_cost":             "0",
		"parallel_tuple_cost":             "0",
		"min_parallel_table_scan_size":    "0",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	setup, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(ctx, `CREATE TABLE big AS SELECT g FROM generate_series(1, 200000) g; ANALYZE big`); err != nil {
		t.Fatal(err)
	}
	// The load's query must run with parallel workers, or the test does not
	// test them.
	var plan strings.Builder
	rows, err := setup.Query(ctx, `EXPLAIN SELECT count(*) FROM big`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan.String(), "Workers Planned") {
		t.Fatalf("the load's query is not planned in parallel:\n%s", plan.String())
	}
	_ = setup.Close(ctx)

	// The load, until the end of the test: 4 clients running parallel
	// queries, reconnecting when the server is gone, and 4 connecting,
	// querying and disconnecting in a loop.
	var parallel, connects atomic.Int64
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	for range 4 {
		wg.Go(func() {
			for lctx.Err() == nil {
				conn, err := connect(lctx, c.URL("postgres"))
				if err != nil {
					continue
				}
				for lctx.Err() == nil {
					if _, err := conn.Exec(lctx, `SELECT count(*) FROM big`); err != nil {
						break
					}
					parallel.Add(1)
				}
				_ = conn.Close(context.Background())
			}
		})
		wg.Go(func() {
			for lctx.Err() == nil {
				conn, err := connect(lctx, c.URL("postgres"))
				if err != nil {
					continue
				}
				if _, err := conn.Exec(lctx, `SELECT 1`); err == nil {
					connects.Add(1)
				}
				_ = conn.Close(context.Background())
			}
		})
	}

	dataDir := c.dataDir
	for round := 1; round <= 3; round++ {
		// Busy again since the last start: some parallel queries and some
		// new connections have run.
		p0, c0 := parallel.Load(), connects.Load()
		deadline := time.Now().Add(30 * time.Second)
		for parallel.Load()-p0 < 3 || connects.Load()-c0 < 10 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the load did not run after the start: %d parallel queries, %d connections", round, parallel.Load()-p0, connects.Load()-c0)
			}
			time.Sleep(5 * time.Millisecond)
		}
		before := serverProcesses(t, dataDir)
		if len(before) < 2 {
			t.Fatalf("round %d: %d processes of the server before the kill; want the postmaster and its children", round, len(before))
		}
		killStart := time.Now()
		if err := c.Kill(); err != nil {
			t.Fatalf("round %d: kill: %v", round, err)
		}
		took := time.Since(killStart)
		left := serverProcesses(t, dataDir)
		t.Logf("round %d: %d parallel queries and %d connections since the start; %d processes before the kill, %d after (Kill took %s)",
			round, parallel.Load()-p0, connects.Load()-c0, len(before), len(left), took.Round(time.Millisecond))
		if len(left) > 0 {
			t.Errorf("round %d: processes of the killed server still running after Kill returned:\n%s", round, describe(left))
		}
		// No retry: a process of the old server still attached to its
		// shared memory makes this start fail.
		if err := c.StartAgain(ctx); err != nil {
			t.Fatalf("round %d: start after the kill: %v\nstill running: %s", round, err, describe(serverProcesses(t, dataDir)))
		}
	}
}

func connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, url)
	if err != nil && ctx.Err() == nil {
		// The server is down (killed, starting): try again shortly.
		time.Sleep(5 * time.Millisecond)
	}
	return conn, err
}

// serverProcesses returns the live (not zombie) processes whose working
// directory is dataDir: the postmaster changes into its data directory at
// start, and every process it forks inherits it, also after the postmaster
// died and they were reparented. Found independently of how Kill finds them.
func serverProcesses(t *testing.T, dataDir string) []int {
	t.Helper()
	want, err := filepath.EvalSymlinks(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, os.ErrPermission) {
				t.Logf("process %d: %v", pid, err)
			}
			continue
		}
		if cwd != want {
			continue
		}
		if st, ok := procStat(pid); ok && st.state != "Z" && st.state != "X" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// describe names processes for a failure message: command line, state and
// what they wait on.
func describe(pids []int) string {
	var b strings.Builder
	for _, p := range pids {
		dir := "/proc/" + strconv.Itoa(p)
		cmdline, _ := os.ReadFile(dir + "/cmdline")
		wchan, _ := os.ReadFile(dir + "/wchan")
		st, _ := procStat(p)
		fmt.Fprintf(&b, "  pid %d ppid %d state %s wchan %s: %s\n", p, st.ppid, st.state, wchan, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return b.String()
}
