package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/cli"
	"github.com/fencegate/fencegate/outbox"
)

// cliRun runs one command line of this program (the gateway CLI with the
// notify kind) and returns its exit code and stdout as JSON.
func cliRun(t *testing.T, opts cli.Options, args ...string) (int, map[string]any) {
	t.Helper()
	var out, errOut bytes.Buffer
	opts.Stdout, opts.Stderr = &out, &errOut
	opts.Getenv = adaptertest.Getenv
	code := cli.Main(context.Background(), args, opts)
	var m map[string]any
	_ = json.Unmarshal(out.Bytes(), &m)
	if code != 0 {
		t.Logf("%v: exit %d, stdout %s, stderr %s", args, code, out.String(), errOut.String())
	}
	return code, m
}

// The kind this program registers once (cliOptions) is enqueued through
// the CLI (`enqueue --kind notify`), the HTTP intake and Go, with its
// payload rules on each; `run --adapters notify` executes all three once
// each; the pages offer the kind and list its intents.
func TestOwnKindThroughCLIIntakeGoAndPages(t *testing.T) {
	t.Parallel()
	r, endpoint := newReceiver(t)
	db := adaptertest.NewDatabase(t)
	natsURL := adaptertest.StartNATS(t)
	opts := cliOptions(endpoint)

	// run: relay and the notify adapter, the admin server on a free port.
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	runDone := make(chan int, 1)
	go func() {
		o := opts
		o.Stdout, o.Stderr, o.Getenv = io.Discard, logs, adaptertest.Getenv
		runDone <- cli.Main(ctx, []string{"run", "--database-url", db, "--nats-url", natsURL, "--adapters", "notify",
			"--admin-addr", "127.0.0.1:0", "--log-format", "json", "--allow-fsync-off"}, o)
	}()
	defer func() {
		cancel()
		if code := <-runDone; code != 0 {
			t.Errorf("run exited %d:\n%s", code, logs.String())
		}
	}()
	addrRe := regexp.MustCompile(`"msg":"gateway: serving the admin API and pages"[^\n]*"addr":"(127\.0\.0\.1:\d+)"`)
	var adminAddr string
	for deadline := time.Now().Add(time.Minute); adminAddr == ""; {
		if m := addrRe.FindStringSubmatch(logs.String()); m != nil {
			adminAddr = m[1]
			break
		}
		select {
		case code := <-runDone:
			runDone <- code
			t.Fatalf("run exited %d before serving:\n%s", code, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("run is not serving the admin API after a minute:\n%s", logs.String())
		}
	}

	code, l := cliRun(t, opts, "lease", "acquire", "--database-url", db, "--resource", "ops-digest", "--holder", "w", "--ttl", "1m")
	if code != 0 {
		t.Fatalf("lease acquire: exit %d", code)
	}
	epoch := int64(l["epoch"].(float64))
	ep := fmt.Sprint(epoch)

	// CLI: a bad payload is exit 2 naming the field; a good one is stored.
	code, bad := cliRun(t, opts, "enqueue", "--database-url", db, "--resource", "ops-digest", "--epoch", ep, "--op", "cli-0",
		"--kind", "notify", "--payload", `{"text":"x"}`)
	if e, _ := bad["error"].(map[string]any); code != 2 || e["field"] != "payload.channel" {
		t.Fatalf("CLI enqueue of a bad payload: exit %d %v, want 2 naming payload.channel", code, bad)
	}
	code, viaCLI := cliRun(t, opts, "enqueue", "--database-url", db, "--resource", "ops-digest", "--epoch", ep, "--op", "cli-1",
		"--kind", "notify", "--payload", `{"channel":"ops","text":"from the CLI"}`)
	if code != 0 {
		t.Fatalf("CLI enqueue: exit %d", code)
	}

	// HTTP intake.
	resp, err := http.Post("http://"+adminAddr+"/api/v1/intents", "application/json", strings.NewReader(fmt.Sprintf(
		`{"resource":"ops-digest","epoch":%d,"operation_id":"http-1","kind":"notify","payload":{"channel":"ops","text":"over HTTP"}}`, epoch)))
	if err != nil {
		t.Fatal(err)
	}
	var viaHTTP map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&viaHTTP)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("HTTP enqueue: %d %v", resp.StatusCode, viaHTTP)
	}

	// Go, with the same registration.
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	kinds := outbox.DefaultKinds()
	kinds[Kind] = KindSpec()
	ob, err := outbox.New(pool, outbox.Config{Schema: adaptertest.Schema(), Kinds: kinds})
	if err != nil {
		t.Fatal(err)
	}
	viaGo, err := ob.Enqueue(context.Background(), outbox.Intent{Resource: "ops-digest", Epoch: epoch, OperationID: "go-1",
		Kind: Kind, Payload: json.RawMessage(`{"channel":"ops","text":"from Go"}`)})
	if err != nil {
		t.Fatal(err)
	}

	ids := []string{fmt.Sprint(int64(viaCLI["intent_id"].(float64))), fmt.Sprint(int64(viaHTTP["intent_id"].(float64))), fmt.Sprint(viaGo.IntentID)}
	for _, id := range ids {
		for deadline := time.Now().Add(time.Minute); ; {
			code, st := cliRun(t, opts, "status", "--database-url", db, id)
			if code == 0 && st["status"] == "succeeded" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("intent %s: %v, not succeeded within a minute", id, st)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, op := range []string{"cli-1", "http-1", "go-1"} {
		if n := r.postsOf("ops-digest/" + op); n != 1 {
			t.Errorf("%s posted %d times, want once", op, n)
		}
	}

	// The pages offer the kind and list its intents.
	resp, err = http.Get("http://" + adminAddr + "/?kind=notify")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), `<option value="notify">`) {
		t.Fatalf("the intents page does not offer kind notify:\n%.2000s", page)
	}
	for _, op := range []string{"cli-1", "http-1", "go-1"} {
		if !strings.Contains(string(page), op) {
			t.Errorf("the intents page filtered by kind notify does not list %s", op)
		}
	}
}

// syncBuffer is a bytes.Buffer that the program's logger writes to while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
