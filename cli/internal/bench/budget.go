package bench

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"
)

// Budget is what PostgreSQL and the process that drives it spent over one
// measured run, divided by the units it finished (intents settled by
// fencegate, jobs worked by River). A column that could not be measured
// is left out and Absent says why.
type Budget struct {
	// Unit is what the columns are per: "intent" or "job".
	Unit string `json:"unit"`
	// Units is how many were finished in the window.
	Units   int     `json:"units"`
	Seconds float64 `json:"seconds"`
	// PGCPUUs: user+system CPU of the PostgreSQL server's processes (the
	// postmaster, every backend and auxiliary process, and those that exited
	// in the window), from /proc; only when the bench started the server.
	PGCPUUs *float64 `json:"pg_cpu_us_per_intent,omitempty"`
	// GatewayCPUUs: user+system CPU of the process that drove PostgreSQL:
	// for fencegate the bench's own process, which runs `gateway run`
	// (relay and adapters) and, unless --nats-url is given, the embedded
	// JetStream server; for River its peer's process.
	GatewayCPUUs *float64 `json:"gateway_cpu_us_per_intent,omitempty"`
	// Statements: top-level statements executed (pg_stat_statements calls,
	// BEGIN and COMMIT included), the bench's own probes excluded.
	Statements *float64 `json:"statements_per_intent,omitempty"`
	// RoundTrips: client requests that waited for PostgreSQL's answer.
	RoundTrips *float64 `json:"round_trips_per_intent,omitempty"`
	// WALBytes: pg_current_wal_lsn() difference (full-page images included).
	WALBytes float64 `json:"wal_bytes_per_intent"`
	// RowVersions is inserted + updated over every table: the row versions
	// written.
	RowVersions float64 `json:"row_versions_per_intent_total"`
	// Tables: row versions written per table that changed.
	Tables map[string]TableWrites `json:"row_versions_per_intent"`
	// TopStatements are the statements that took the server longest in
	// the window (total execution time), at most 12.
	TopStatements []StatementCost `json:"top_statements,omitempty"`
	// RoundTripConns is how many connections the round trips were counted
	// on.
	RoundTripConns int `json:"round_trip_connections,omitempty"`
	// CPUCovers says what GatewayCPUUs measured.
	CPUCovers string `json:"gateway_cpu_covers,omitempty"`
	// Absent names each left-out column with the reason.
	Absent map[string]string `json:"absent,omitempty"`
}

// TableWrites are one table's writes per unit (pg_stat_user_tables).
type TableWrites struct {
	Inserted   float64 `json:"inserted"`
	Updated    float64 `json:"updated"`
	HOTUpdated float64 `json:"hot_updated"`
	Deleted    float64 `json:"deleted"`
	// HOTShare is HOT updates / updates: updates that wrote no index entry.
	HOTShare float64 `json:"hot_share"`
}

// StatementCost is one statement's share of the budget.
type StatementCost struct {
	Query      string  `json:"query"`
	Calls      float64 `json:"calls_per_intent"`
	Rows       float64 `json:"rows_per_intent"`
	WALBytes   float64 `json:"wal_bytes_per_intent"`
	ExecTimeMs float64 `json:"exec_ms_total"`
}

// benchTag marks the bench's own statements (its probes and these
// snapshots), which the statement count leaves out.
const benchTag = "/* fencegate-bench */ "

// tableCounts are one table's cumulative pg_stat_user_tables counters.
type tableCounts struct{ ins, upd, hot, del int64 }

// stmtCounts are one statement's cumulative pg_stat_statements counters.
type stmtCounts struct {
	query          string
	calls, rows    int64
	wal            float64
	execMs         float64
	dbOID, queryID int64
}

// pgSnapshot is the server's side of a budget at one moment.
type pgSnapshot struct {
	at     time.Time
	lsn    string
	tables map[string]tableCounts
	stmts  map[[2]int64]stmtCounts // (dbid, queryid)
	// stmtErr is why pg_stat_statements could not be read ("" when it was).
	stmtErr string
	// cpuTicks is the server's CPU in clock ticks; -1 unknown, and cpuOff
	// says why.
	cpuTicks int64
	cpuOff   string
}

// serverProcs names the PostgreSQL server's processes: its postmaster's
// pid, or 0 and why it is not known.
type serverProcs struct {
	pid int
	off string
}

// querier is what a snapshot reads through: a pool or one connection.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// snapshotPG reads the counters: the tables of schema in the database q
// is connected to, WAL position and pg_stat_statements through stmtQ (the
// database where the extension is), and the server's CPU when its
// postmaster is known.
func snapshotPG(ctx context.Context, q, stmtQ querier, stmtsOff, schema string, server serverProcs) (*pgSnapshot, error) {
	s := &pgSnapshot{at: time.Now(), tables: map[string]tableCounts{}, stmts: map[[2]int64]stmtCounts{}, cpuTicks: -1, cpuOff: server.off}
	// Counters of the backends that have not flushed yet are not in the
	// view; the callers take snapshots when the measured clients' backends
	// have exited (pgStatsSettled), which flushes them.
	if err := q.QueryRow(ctx, benchTag+`SELECT pg_current_wal_lsn()::text`).Scan(&s.lsn); err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, benchTag+`SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables WHERE schemaname = $1`, schema)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name string
		var c tableCounts
		if err := rows.Scan(&name, &c.ins, &c.upd, &c.hot, &c.del); err != nil {
			rows.Close()
			return nil, err
		}
		s.tables[name] = c
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if stmtsOff != "" {
		s.stmtErr = stmtsOff
	} else if err := readStatements(ctx, stmtQ, s); err != nil {
		s.stmtErr = "pg_stat_statements unreadable: " + oneLine(err.Error())
	}
	if server.pid > 0 {
		if s.cpuTicks = processTreeTicks(server.pid); s.cpuTicks < 0 {
			s.cpuOff = "the server's postmaster (pid " + strconv.Itoa(server.pid) + ") is gone"
		}
	}
	return s, nil
}

func readStatements(ctx context.Context, q querier, s *pgSnapshot) error {
	rows, err := q.Query(ctx, benchTag+`SELECT dbid::int8, queryid, calls, rows, wal_bytes::float8, total_exec_time, query
		FROM pg_stat_statements WHERE toplevel AND query NOT LIKE '/* fencegate-bench */%'`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var c stmtCounts
		if err := rows.Scan(&c.dbOID, &c.queryID, &c.calls, &c.rows, &c.wal, &c.execMs, &c.query); err != nil {
			return err
		}
		s.stmts[[2]int64{c.dbOID, c.queryID}] = c
	}
	return rows.Err()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// budgetOf is the budget between two snapshots for units finished, the
// statements counted in database dbOID only.
func budgetOf(unit string, units int, before, after *pgSnapshot, dbOID int64) *Budget {
	n := float64(units)
	b := &Budget{Unit: unit, Units: units, Seconds: after.at.Sub(before.at).Seconds(), Tables: map[string]TableWrites{}, Absent: map[string]string{}}
	if wal, err := lsnDiff(after.lsn, before.lsn); err == nil {
		b.WALBytes = float64(wal) / n
	}
	for name, a := range after.tables {
		p := before.tables[name]
		d := tableCounts{a.ins - p.ins, a.upd - p.upd, a.hot - p.hot, a.del - p.del}
		if d == (tableCounts{}) {
			continue
		}
		t := TableWrites{Inserted: float64(d.ins) / n, Updated: float64(d.upd) / n, HOTUpdated: float64(d.hot) / n, Deleted: float64(d.del) / n}
		if d.upd > 0 {
			t.HOTShare = float64(d.hot) / float64(d.upd)
		}
		b.Tables[name] = t
		b.RowVersions += t.Inserted + t.Updated
	}
	switch {
	case after.stmtErr != "":
		b.Absent["statements_per_intent"] = after.stmtErr
	case before.stmtErr != "":
		b.Absent["statements_per_intent"] = before.stmtErr
	default:
		var total int64
		var costs []StatementCost
		for k, a := range after.stmts {
			if k[0] != dbOID {
				continue
			}
			p := before.stmts[k]
			calls := a.calls - p.calls
			if calls <= 0 {
				continue
			}
			total += calls
			costs = append(costs, StatementCost{Query: truncate(oneLine(a.query), 160), Calls: float64(calls) / n,
				Rows: float64(a.rows-p.rows) / n, WALBytes: (a.wal - p.wal) / n, ExecTimeMs: a.execMs - p.execMs})
		}
		sort.Slice(costs, func(i, j int) bool { return costs[i].ExecTimeMs > costs[j].ExecTimeMs })
		b.TopStatements = costs[:min(len(costs), 12)]
		b.Statements = ptr(float64(total) / n)
	}
	if before.cpuTicks >= 0 && after.cpuTicks >= 0 {
		b.PGCPUUs = ptr(float64(after.cpuTicks-before.cpuTicks) * 1e6 / clockTicks / n)
	} else {
		b.Absent["pg_cpu_us_per_intent"] = cmp.Or(after.cpuOff, before.cpuOff, "the server's processes are not known")
	}
	return b
}

func ptr(v float64) *float64 { return &v }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// lsnDiff is a - b in bytes for two LSNs written as PostgreSQL prints them.
func lsnDiff(a, b string) (int64, error) {
	pa, err := parseLSN(a)
	if err != nil {
		return 0, err
	}
	pb, err := parseLSN(b)
	if err != nil {
		return 0, err
	}
	return int64(pa - pb), nil
}

func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("bad LSN %q", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, err
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, err
	}
	return h<<32 | l, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// processTreeTicks is the CPU time, in clock ticks, of process root and
// every process under it, plus what its exited children used (cutime and
// cstime, which a parent gains when it reaps them: the postmaster reaps
// its backends, so a backend that exited in the window still counts).
func processTreeTicks(root int) int64 {
	type proc struct {
		ppid  int
		ticks int64
	}
	procs := map[int]proc{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, self, children, ok := procTimes(pid)
		if !ok {
			continue
		}
		t := self
		if pid == root {
			t += children
		}
		procs[pid] = proc{ppid, t}
	}
	if _, ok := procs[root]; !ok {
		return -1
	}
	var total int64
	var walk func(int)
	kids := map[int][]int{}
	for pid, p := range procs {
		kids[p.ppid] = append(kids[p.ppid], pid)
	}
	walk = func(pid int) {
		total += procs[pid].ticks
		for _, k := range kids[pid] {
			walk(k)
		}
	}
	walk(root)
	return total
}

// procTimes reads /proc/<pid>/stat: the parent, utime+stime, and
// cutime+cstime.
func procTimes(pid int) (ppid int, self, children int64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): field k is f[k-3].
	if len(f) < 15 {
		return 0, 0, 0, false
	}
	num := func(k int) int64 { n, _ := strconv.ParseInt(f[k-3], 10, 64); return n }
	return int(num(4)), num(14) + num(15), num(16) + num(17), true
}

// localPostmaster finds the postmaster of the server q is connected to
// when that server runs on this machine and its processes are visible
// here (postmasterOf says how), or returns 0 and why not. Reading
// data_directory takes a superuser or pg_read_all_settings.
func localPostmaster(ctx context.Context, q querier) (pid int, why string) {
	var backend int
	var dataDir string
	if err := q.QueryRow(ctx, benchTag+`SELECT pg_backend_pid(), current_setting('data_directory')`).Scan(&backend, &dataDir); err != nil {
		return 0, "the server's data directory is not readable by this role (superuser or pg_read_all_settings): " + oneLine(err.Error())
	}
	return postmasterOf(backend, dataDir)
}

// postmasterOf is the parent of process backend, taken for the postmaster
// of the server whose data directory is dataDir only when that process
// works in dataDir (a postmaster does): a backend pid from another host
// or container, which may name an unrelated process here, is refused.
func postmasterOf(backend int, dataDir string) (pid int, why string) {
	ppid, _, _, ok := procTimes(backend)
	if !ok {
		return 0, "the server's processes are not on this machine (its backend, pid " + strconv.Itoa(backend) + ", is not in /proc)"
	}
	cwd, err := os.Readlink("/proc/" + strconv.Itoa(ppid) + "/cwd")
	if err != nil {
		return 0, "the server's processes are not readable by this user: " + oneLine(err.Error())
	}
	if filepath.Clean(cwd) != filepath.Clean(dataDir) {
		return 0, "the server's processes are not on this machine (pid " + strconv.Itoa(ppid) + " does not work in the data directory " + dataDir + ")"
	}
	return ppid, ""
}

// selfCPU is this process's user+system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pgTCPPort is the TCP port of the PostgreSQL URL, or 0 when it does not
// connect over TCP (a Unix socket).
func pgTCPPort(dbURL string) int {
	u, err := url.Parse(dbURL)
	if err != nil || u.Hostname() == "" || strings.HasPrefix(u.Hostname(), "/") || u.Query().Get("host") != "" {
		return 0
	}
	if p := u.Port(); p != "" {
		n, _ := strconv.Atoi(p)
		return n
	}
	return 5432
}

// tcpRequests counts, per socket of this process connected to TCP port
// port (by inode), the segments with data it sent: its requests.
//
// A PostgreSQL client sends a request (a query, a pipelined batch, BEGIN,
// COMMIT) in one write, TCP_NODELAY set (Go's default), then waits for the
// answer: one data segment per round trip on loopback, where a segment
// holds up to 64 KiB. The kernel counts them per socket (tcp_info's
// data_segs_out), which costs the measured process nothing, unlike a
// counting proxy or a tracer installed in its pool.
func tcpRequests(port int) (map[uint64]uint32, error) {
	dir := "/proc/self/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[uint64]uint32{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		inode, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"), 10, 64)
		if err != nil {
			continue
		}
		sa, err := unix.Getpeername(fd)
		if err != nil {
			continue
		}
		var peerPort int
		switch a := sa.(type) {
		case *unix.SockaddrInet4:
			peerPort = a.Port
		case *unix.SockaddrInet6:
			peerPort = a.Port
		default:
			continue
		}
		if peerPort != port {
			continue
		}
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			continue
		}
		out[inode] = info.Data_segs_out
	}
	return out, nil
}

// newRequests is the requests sent, by the time of after, on sockets that
// did not exist at before: those the measured run opened.
func newRequests(before, after map[uint64]uint32) (n int64, sockets int) {
	for inode, segs := range after {
		if _, old := before[inode]; !old {
			n += int64(segs)
			sockets++
		}
	}
	return n, sockets
}

// benchAppName is the application_name of the bench's own connections,
// which pgStatsSettled does not wait for.
const benchAppName = "fencegate-bench"

// pgStatsSettled waits until no client other than the bench's own is
// connected to database db. A backend flushes its table counters when it
// exits, before it leaves pg_stat_activity (its statistics hook runs before
// the one that clears its entry there), so after this every write the
// measured clients made is in pg_stat_user_tables; a live backend flushes
// at most once a second.
func pgStatsSettled(ctx context.Context, q querier, db string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := q.QueryRow(ctx, benchTag+`SELECT count(*) FROM pg_stat_activity
			WHERE datname = $1 AND backend_type = 'client backend' AND application_name <> $2`, db, benchAppName).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d sessions still connected to %s after 30s", n, db)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// flushBenchStats makes each idle connection of the bench's pool flush its
// pending table counters now (pg_stat_force_next_flush, PostgreSQL 15), so
// that the bench's own writes before a measurement (the backlog's COPY)
// are not counted in it when the connection would flush them later.
// Older servers lack the function: then nothing is forced.
func flushBenchStats(ctx context.Context, p *pgxpool.Pool) {
	for _, c := range p.AcquireAllIdle(ctx) {
		_, _ = c.Exec(ctx, benchTag+`SELECT pg_stat_force_next_flush()`)
		c.Release()
	}
}
