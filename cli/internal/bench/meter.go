package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// budgetMeter measures the budget of fencegate's drain: the server's
// counters before and after it, the bench process's CPU (it runs `gateway
// run`), and the requests on the connections the gateway opened.
type budgetMeter struct {
	e *benchEnv
	// conn is the one connection the bench reads through while it
	// measures: its probes and snapshots open no connection the request
	// count would take for the gateway's.
	conn    *pgxpool.Conn
	before  *pgSnapshot
	cpu0    time.Duration
	sock0   map[uint64]uint32
	sockErr error
	reqs    int64
	conns   int
}

// startMeter takes the "before" side, once the bench's own writes (the
// backlog) are flushed to the statistics and earlier clients are gone.
func (e *benchEnv) startMeter(ctx context.Context) (*budgetMeter, error) {
	flushBenchStats(ctx, e.pool)
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	m := &budgetMeter{e: e, conn: conn}
	if err := pgStatsSettled(ctx, conn, e.dbName); err != nil {
		m.close()
		return nil, err
	}
	if m.before, err = snapshotPG(ctx, conn, conn, e.stmtsOff, e.schema.Name(), e.pg); err != nil {
		m.close()
		return nil, err
	}
	if e.pgPort > 0 {
		m.sock0, m.sockErr = tcpRequests(e.pgPort)
	}
	m.cpu0 = selfCPU()
	return m, nil
}

func (m *budgetMeter) close() {
	if m.conn != nil {
		m.conn.Release()
		m.conn = nil
	}
}

// readRequests counts the requests sent on the connections opened since
// startMeter, all of them the gateway's, while they are still open.
func (m *budgetMeter) readRequests() {
	if m.e.pgPort == 0 || m.sockErr != nil {
		return
	}
	var after map[uint64]uint32
	if after, m.sockErr = tcpRequests(m.e.pgPort); m.sockErr == nil {
		m.reqs, m.conns = newRequests(m.sock0, after)
	}
}

// finish takes the "after" side, once the gateway's backends are gone
// (their counters flushed), and returns the budget per settled intent.
func (m *budgetMeter) finish(ctx context.Context, n int) (*Budget, error) {
	e := m.e
	if n <= 0 {
		// A budget of nothing would print numbers of nothing.
		return nil, fmt.Errorf("budget: %d intents settled: nothing to measure", n)
	}
	cpu := selfCPU() - m.cpu0
	if err := pgStatsSettled(ctx, m.conn, e.dbName); err != nil {
		return nil, err
	}
	after, err := snapshotPG(ctx, m.conn, m.conn, e.stmtsOff, e.schema.Name(), e.pg)
	if err != nil {
		return nil, err
	}
	b := budgetOf("intent", n, m.before, after, e.dbOID)
	b.GatewayCPUUs = ptr(float64(cpu.Microseconds()) / float64(n))
	b.CPUCovers = "the bench's process: gateway run (relay, adapter runtime, no-op adapter), the bench's completion probe"
	if e.natsEmbedded {
		b.CPUCovers += ", and the embedded JetStream server"
	}
	switch {
	case e.pgPort == 0:
		b.Absent["round_trips_per_intent"] = "the database URL is not TCP: requests are counted per TCP connection (tcp_info)"
	case m.sockErr != nil:
		b.Absent["round_trips_per_intent"] = "reading this process's sockets: " + oneLine(m.sockErr.Error())
	case m.conns == 0:
		b.Absent["round_trips_per_intent"] = "no connection of the gateway's was seen"
	default:
		b.RoundTrips, b.RoundTripConns = ptr(float64(m.reqs)/float64(n)), m.conns
	}
	return b, nil
}

// RiverRun is River's side of e2e-drain: its peer working as many jobs as
// fencegate settled, on the same server, right after.
type RiverRun struct {
	Peer   string  `json:"peer"`
	Jobs   int     `json:"jobs"`
	Rate   float64 `json:"jobs_per_s"`
	Budget *Budget `json:"budget"`
	Note   string  `json:"note"`
}

// runRiver runs the riverwork peer (--river-peer) in River's database:
// it inserts n jobs, then, between the bench's snapshots, works them.
func (e *benchEnv) runRiver(ctx context.Context, n int) (*RiverRun, error) {
	fmt.Fprintf(e.log, "gateway bench: River's peer, %d jobs…\n", n)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(rctx, e.riverPeer, "--database-url", e.riverURL, "--jobs", strconv.Itoa(n))
	stderr := &tailWriter{max: 8 << 10}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	waited := false
	defer func() {
		if !waited {
			cancel()
			_ = cmd.Wait()
		}
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-rctx.Done():
				return
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	next := func(what string) (string, error) {
		t := time.NewTimer(10 * time.Minute)
		defer t.Stop()
		select {
		case l, ok := <-lines:
			if !ok {
				return "", fmt.Errorf("exited before %s: %s", what, stderr.String())
			}
			return l, nil
		case <-t.C:
			return "", fmt.Errorf("no %s within 10 minutes: %s", what, stderr.String())
		}
	}
	if l, err := next("ready"); err != nil {
		return nil, err
	} else if l != "ready" {
		return nil, fmt.Errorf("said %q, not ready", l)
	}

	var riverOID int64
	if err := e.riverPool.QueryRow(ctx, benchTag+`SELECT oid::int8 FROM pg_database WHERE datname = current_database()`).Scan(&riverOID); err != nil {
		return nil, err
	}
	// The peer closed the pool it inserted with: once its backends are
	// gone, the inserts are counted before the window, not in it.
	if err := pgStatsSettled(ctx, e.riverPool, e.riverDB); err != nil {
		return nil, err
	}
	before, err := snapshotPG(ctx, e.riverPool, e.pool, e.stmtsOff, "public", e.pg)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return nil, err
	}
	l, err := next("its result")
	if err != nil {
		return nil, err
	}
	var res struct {
		Jobs     int     `json:"jobs"`
		Rate     float64 `json:"jobs_per_s"`
		CPUUs    int64   `json:"cpu_us"`
		Requests int64   `json:"requests"`
	}
	if err := json.Unmarshal([]byte(l), &res); err != nil || res.Jobs != n {
		return nil, fmt.Errorf("result %q: %v", l, err)
	}
	_ = stdin.Close()
	waited = true
	if err := cmd.Wait(); err != nil {
		return nil, errors.Join(err, errors.New(stderr.String()))
	}
	if err := pgStatsSettled(ctx, e.riverPool, e.riverDB); err != nil {
		return nil, err
	}
	after, err := snapshotPG(ctx, e.riverPool, e.pool, e.stmtsOff, "public", e.pg)
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("budget: River worked %d jobs: nothing to measure", n)
	}
	b := budgetOf("job", n, before, after, riverOID)
	b.GatewayCPUUs = ptr(float64(res.CPUUs) / float64(n))
	b.CPUCovers = "the peer's process (River's client: producer, completer, 100 no-op workers), from its start to the last completion"
	b.RoundTrips = ptr(float64(res.Requests) / float64(n))
	return &RiverRun{Peer: e.riverPeer, Jobs: n, Rate: res.Rate, Budget: b,
		Note: "River v0.51.2 (riverpgxv5): the peer's work-tuned case (100 workers, 5 ms fetch cooldown, 50 ms poll) in a database of its own on the same server" +
			"; round trips counted by a pgx tracer in its pool (queries, batches, CopyFrom, prepares)"}, nil
}
