package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// memoExecutor stands for a new built-in adapter's package: it records
// each intent's payload text with the note its flag gave.
type memoExecutor struct {
	note string
	mu   sync.Mutex
	done []string
}

func (m *memoExecutor) Kind() string                        { return "memo" }
func (m *memoExecutor) Capabilities() adapters.Capabilities { return adapters.Capabilities{} }
func (m *memoExecutor) Execute(_ context.Context, req adapters.Request) (adapters.Outcome, error) {
	var p struct{ Text string }
	if err := json.Unmarshal(req.Payload, &p); err != nil {
		return adapters.Outcome{}, adapters.PermanentError(err)
	}
	m.mu.Lock()
	m.done = append(m.done, m.note+": "+p.Text)
	m.mu.Unlock()
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: json.RawMessage(`{}`)}, nil
}

func (m *memoExecutor) executed() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.done)
}

// memoSpec is the memo kind's rules: a non-empty text.
var memoSpec = outbox.KindSpec{DefaultFence: outbox.FenceCommit, Validate: func(p map[string]any) error {
	if s, _ := p["text"].(string); s == "" {
		return &outbox.ValidationError{Field: "payload.text", Message: "must not be empty"}
	}
	return nil
}}

// memoFlags stands for the adapter's one CLI file: its flag, its check,
// its registration.
type memoFlags struct {
	note *string
	made *memoExecutor
}

func (f *memoFlags) check(_ adapterEnv, runs bool) error {
	if runs && *f.note == "" {
		return badInput("memo_note", "--memo-note must not be empty when the memo adapter runs")
	}
	return nil
}

func (f *memoFlags) registration(context.Context, adapterEnv) (adapters.Registration, error) {
	f.made = &memoExecutor{note: *f.note}
	return adapters.Registration{Kind: "memo", Spec: memoSpec, Executor: f.made}, nil
}

// A new built-in adapter in a test-only build is its package (memoExecutor),
// one CLI file (memoFlags) and one line registering it (the append to
// builtinAdapters): gateway run then takes its flag, checks it naming its
// field, runs the adapter when --adapters names it, and gateway enqueue and
// the run's intake accept its kind with its rules. Not parallel: it
// changes builtinAdapters before the package's parallel tests run.
func TestNewBuiltinAdapterIsOneFileAndOneLine(t *testing.T) {
	var memo *memoFlags
	saved := builtinAdapters
	builtinAdapters = append(slices.Clip(builtinAdapters), builtinAdapter{kind: "memo",
		flags: func(fs *flag.FlagSet) adapterFlags {
			memo = &memoFlags{note: fs.String("memo-note", "", "the note the memo adapter records")}
			return memo
		},
		enqueueSpec: func(func(string) string) (outbox.KindSpec, bool, error) { return memoSpec, true, nil }})
	t.Cleanup(func() { builtinAdapters = saved })

	cli := func(ctx context.Context, stderr io.Writer, args ...string) (int, map[string]any) {
		var out bytes.Buffer
		a := &app{stdout: &out, stderr: stderr, getenv: testdb.SchemaEnv}
		code := a.main(ctx, args)
		var m map[string]any
		_ = json.Unmarshal(out.Bytes(), &m)
		return code, m
	}
	if code, m := cli(context.Background(), io.Discard, "run", "--database-url", "postgres://127.0.0.1:1/none", "--adapters", "memo"); code != exitBadInput ||
		fmt.Sprint(m["error"].(map[string]any)["field"]) != "memo_note" {
		t.Fatalf("run --adapters memo without --memo-note: exit %d %v, want 2 naming memo_note", code, m)
	}

	e := newRunEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	runDone := make(chan int, 1)
	go func() {
		code, _ := cli(ctx, logs, "run", "--database-url", e.db, "--nats-url", e.natsURL, "--adapters", "memo", "--memo-note", "noted",
			"--allow-fsync-off")
		runDone <- code
	}()
	defer func() {
		cancel()
		if code := <-runDone; code != exitOK {
			t.Errorf("run exited %d:\n%s", code, logs.String())
		}
	}()

	code, l := cli(context.Background(), io.Discard, "lease", "acquire", "--database-url", e.db, "--resource", "memos", "--holder", "w", "--ttl", "1m")
	if code != exitOK {
		t.Fatalf("lease acquire: exit %d %v", code, l)
	}
	epoch := fmt.Sprint(int64(l["epoch"].(float64)))
	code, bad := cli(context.Background(), io.Discard, "enqueue", "--database-url", e.db, "--resource", "memos", "--epoch", epoch, "--op", "m-0",
		"--kind", "memo", "--payload", `{"text":""}`)
	if e, _ := bad["error"].(map[string]any); code != exitBadInput || e["field"] != "payload.text" {
		t.Fatalf("enqueue of a bad memo: exit %d %v, want 2 naming payload.text", code, bad)
	}
	code, r := cli(context.Background(), io.Discard, "enqueue", "--database-url", e.db, "--resource", "memos", "--epoch", epoch, "--op", "m-1",
		"--kind", "memo", "--payload", `{"text":"hello"}`)
	if code != exitOK {
		t.Fatalf("enqueue: exit %d %v", code, r)
	}
	id := fmt.Sprint(int64(r["intent_id"].(float64)))
	pollUntil(t, time.Minute, "the memo intent to succeed", func() (bool, string) {
		_, st := cli(context.Background(), io.Discard, "status", "--database-url", e.db, id)
		return st["status"] == "succeeded", fmt.Sprint(st) + "\n" + logs.String()
	})
	if got := memo.made.executed(); len(got) != 1 || got[0] != "noted: hello" {
		t.Fatalf("the memo adapter executed %q, want once with its flag's note", got)
	}
	if !strings.Contains(logs.String(), "adapters=memo") {
		t.Fatalf("the running line does not name the memo adapter:\n%s", logs.String())
	}
}
