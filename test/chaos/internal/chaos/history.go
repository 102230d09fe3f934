// Package chaos is the randomized fault run of fencegate: worker processes
// (RunWorker) take short leases and enqueue email, webhook and file
// intents while a nemesis pauses workers past their TTL, kills and
// restarts `gateway run` processes, restarts NATS and PostgreSQL, and
// makes the destinations misbehave (SMTPFront, HookReceiver: act then
// drop the connection, answer late, push back with Retry-After, reset
// mid-answer); afterwards a checker verifies the invariants, the effects
// at each destination against the intents' final statuses, and the
// linearizability of the lease/epoch register from the logged history
// (see docs/guarantees.md, "Guarantees and how we test them"), and that
// the run exercised what it checks. The run itself is the test in
// test/chaos (its short form in go test ./...; make chaos SEED=…
// DURATION=…).
package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"golang.org/x/sys/unix"
)

// Op is one logged operation of a worker: its invocation and response
// times on the machine's monotonic clock (CLOCK_MONOTONIC, comparable
// across processes), its input and its outcome.
type Op struct {
	Worker string `json:"w"`
	// Kind: acquire, renew, release, enqueue.
	Kind     string `json:"op"`
	Resource string `json:"res"`
	Holder   string `json:"holder,omitempty"`
	// Epoch is the epoch supplied (renew, release, enqueue).
	Epoch int64 `json:"epoch,omitempty"`
	Call  int64 `json:"call"`
	Ret   int64 `json:"ret"`
	// Result: ok, held, stale, conflict, invalid, unknown (the outcome was
	// lost: a connection failed mid-call), noconn (a lease operation that
	// could not connect: it did not happen).
	Result string `json:"result"`
	// OutEpoch is the epoch returned (acquire, renew) or the current epoch
	// an error reported.
	OutEpoch int64 `json:"out_epoch,omitempty"`
	// OutHolder is the holder a lease_held error named.
	OutHolder string `json:"out_holder,omitempty"`
	// Enqueue fields.
	OpID      string `json:"opid,omitempty"`
	IntentKnd string `json:"kind,omitempty"`
	Key       string `json:"key,omitempty"`
	Payload   string `json:"payload,omitempty"`
	IntentID  int64  `json:"intent_id,omitempty"`
	Duplicate bool   `json:"dup,omitempty"`
	// Reuse marks an enqueue that deliberately reused an earlier operation
	// id with different content (it must be refused, I6).
	Reuse bool `json:"reuse,omitempty"`
	// Err is the error text of unknown/invalid outcomes.
	Err string `json:"err,omitempty"`
}

// String returns o as one JSON line.
func (o Op) String() string {
	b, _ := json.Marshal(o)
	return string(b)
}

// Mono returns CLOCK_MONOTONIC in nanoseconds: one clock for every process
// of the machine, unaffected by wall-clock steps.
func Mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// ReadHistory reads the JSON-lines histories of the workers, ordered by
// invocation time. A truncated last line (a worker killed mid-write) is
// skipped.
func ReadHistory(paths []string) ([]Op, error) {
	var ops []Op
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var o Op
			if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
				continue
			}
			ops = append(ops, o)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops, nil
}
