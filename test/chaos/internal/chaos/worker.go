package chaos

// The worker of the chaos run (RunWorker): it loops taking short leases on
// a few resources and enqueueing email, webhook and file intents with
// business keys, and logs every operation (JSON lines, monotonic
// timestamps) to the file named by -out, until SIGTERM. The run starts it
// as a process of its own (the test binary re-executed), so that it can
// be paused and signalled.
//
// SIGUSR1 makes it use the holder id given by -share (another worker's)
// from its next round on, SIGUSR2 its own again: two workers then hold
// leases under one holder id, and every acquire must still return a new
// epoch.

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// WorkerEnv is the environment variable that makes a test binary run
// RunWorker instead of its tests (see test/chaos).
const WorkerEnv = "FENCEGATE_CHAOS_WORKER"

// RunWorker runs one worker with the command-line arguments args and
// returns its exit code.
func RunWorker(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	db := fs.String("db", os.Getenv("GATEWAY_DATABASE_URL"), "database URL")
	schema := fs.String("schema", "", "fencegate's schema (default fencegate)")
	id := fs.String("id", "w0", "worker id (the lease holder)")
	share := fs.String("share", "", "holder id used after SIGUSR1 (until SIGUSR2)")
	seed := fs.Uint64("seed", 1, "random seed")
	resList := fs.String("resources", "res-0,res-1", "resources, comma-separated")
	ttl := fs.Duration("ttl", 400*time.Millisecond, "lease TTL")
	hook := fs.String("hook", "", "base URL of the webhook receiver (none: no webhook intents)")
	out := fs.String("out", "", "history file (JSON lines)")
	if err := fs.Parse(args); err != nil {
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	holderSig := make(chan os.Signal, 4)
	signal.Notify(holderSig, syscall.SIGUSR1, syscall.SIGUSR2)
	f, err := os.OpenFile(*out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w := bufio.NewWriter(f)
	cfg, err := pgxpool.ParseConfig(*db)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	wk := &worker{
		id: *id, holder: *id, rng: rand.New(rand.NewPCG(*seed, 0x5eed)), ttl: *ttl, hook: *hook,
		iss: lease.NewIssuer(pool, lease.WithSchema(*schema)), log: w, resources: strings.Split(*resList, ","),
	}
	wk.ob, err = outbox.New(pool, outbox.Config{Schema: *schema})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for ctx.Err() == nil {
		// The holder changes between rounds only: a round's renew and
		// release use the holder its acquire used.
	drain:
		for {
			select {
			case sig := <-holderSig:
				wk.holder = *id
				if sig == syscall.SIGUSR1 && *share != "" {
					wk.holder = *share
				}
			default:
				break drain
			}
		}
		wk.round(ctx)
	}
	_ = w.Flush()
	_ = f.Close()
	return 0
}

type worker struct {
	id        string
	holder    string // the lease holder id: id, or -share's while shared
	rng       *rand.Rand
	ttl       time.Duration
	hook      string // the webhook receiver's base URL
	iss       *lease.Issuer
	ob        *outbox.Client
	log       *bufio.Writer
	resources []string
	seq       int
	// last enqueued (inserted) operation, for retries and reuse.
	last *outbox.Intent
}

func (w *worker) record(o Op) {
	o.Worker = w.id
	b, _ := json.Marshal(o)
	_, _ = w.log.Write(append(b, '\n'))
	_ = w.log.Flush() // a worker may be SIGKILLed: every line goes out at once
}

// opCtx bounds one call: a worker must not hang on a dead database.
func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

// classify names an operation's outcome from its error. A refusal the
// database answered with (a stale epoch, a held lease, a reused operation
// id) is that refusal: the operation did not take effect. A lost
// connection or a server going away mid-call is "unknown": it may have
// taken effect. Anything else — an SQL error such as a missing relation,
// an invalid input the worker never sends, an error nobody expected — is
// "error", which the checker counts as a violation: a run whose
// operations fail for a reason of its own proves nothing about the
// guarantees.
func classify(err error) string {
	var he *lease.HeldError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &he):
		return "held"
	case errors.Is(err, fenceerr.ErrStaleEpoch): // the issuer's and the outbox's alike
		return "stale"
	case errors.Is(err, outbox.ErrOperationConflict):
		return "conflict"
	case errors.Is(err, lease.ErrBusy):
		return "busy"
	case lost(err):
		return "unknown"
	}
	return "error"
}

// lost reports whether err says the call's connection or server failed,
// so that its outcome was lost (it may or may not have taken effect).
func lost(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// The server answered. Only its answers about itself going away
		// or refusing the session leave the outcome open: a connection
		// exception (class 08), an administrator or crash shutdown, a
		// server starting up, too many connections, a statement
		// cancelled (the call's deadline, possibly inside COMMIT).
		switch pe.Code {
		case "57P01", "57P02", "57P03", "53300", "57014":
			return true
		}
		return strings.HasPrefix(pe.Code, "08")
	}
	var ne net.Error
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &ce), errors.As(err, &ne), pgconn.Timeout(err), pgconn.SafeToRetry(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.DeadlineExceeded):
		return true
	}
	// pgx reports a connection it closed after a failure by text only.
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "unexpected EOF") || strings.Contains(msg, "closed pool")
}

// classifyLease is classify for the lease operations, which send nothing
// before they have a connection: one that could not connect ("noconn")
// did not happen. (An enqueue's outcome stays unknown: the outbox may use
// more than one connection per call.) Telling them apart keeps the
// register model from branching on operations that never reached the
// database.
func classifyLease(err error) string {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return "noconn"
	}
	return classify(err)
}

func (w *worker) sleep(ctx context.Context, max time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(w.rng.Int64N(int64(max) + 1))):
	}
}

func (w *worker) round(ctx context.Context) {
	res := w.resources[w.rng.IntN(len(w.resources))]
	o := Op{Kind: "acquire", Resource: res, Holder: w.holder, Call: Mono()}
	c, cancel := opCtx()
	l, err := w.iss.Acquire(c, res, w.holder, w.ttl)
	cancel()
	o.Ret, o.Result = Mono(), classifyLease(err)
	var he *lease.HeldError
	if errors.As(err, &he) {
		o.OutEpoch, o.OutHolder = he.Epoch, he.Holder
	}
	if err == nil {
		o.OutEpoch = l.Epoch
	} else if o.Result == "unknown" || o.Result == "error" {
		o.Err = err.Error()
	}
	w.record(o)
	if err != nil {
		w.sleep(ctx, w.ttl/2)
		return
	}
	epoch := l.Epoch
	for n := 1 + w.rng.IntN(3); n > 0 && ctx.Err() == nil; n-- {
		w.enqueue(res, epoch)
		w.sleep(ctx, 50*time.Millisecond)
	}
	switch w.rng.IntN(3) {
	case 0:
		w.simple("renew", res, epoch, func(c context.Context) (int64, error) {
			l, err := w.iss.Renew(c, res, w.holder, epoch, w.ttl)
			return l.Epoch, err
		})
		w.enqueue(res, epoch)
		w.simple("release", res, epoch, func(c context.Context) (int64, error) {
			return 0, w.iss.Release(c, res, w.holder, epoch)
		})
	case 1:
		w.simple("release", res, epoch, func(c context.Context) (int64, error) {
			return 0, w.iss.Release(c, res, w.holder, epoch)
		})
	default:
		// Walk away and let the lease expire.
	}
	w.sleep(ctx, w.ttl/2)
}

func (w *worker) simple(kind, res string, epoch int64, f func(context.Context) (int64, error)) {
	o := Op{Kind: kind, Resource: res, Holder: w.holder, Epoch: epoch, Call: Mono()}
	c, cancel := opCtx()
	out, err := f(c)
	cancel()
	o.Ret, o.Result = Mono(), classifyLease(err)
	if err == nil {
		o.OutEpoch = out
	} else if o.Result == "unknown" || o.Result == "error" {
		o.Err = err.Error()
	}
	w.record(o)
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:8])
}

func (w *worker) enqueue(res string, epoch int64) {
	var in outbox.Intent
	reuse := false
	switch p := w.rng.IntN(20); {
	case p == 0 && w.last != nil && w.last.Resource == res:
		// A retry of the last operation (same content): a duplicate.
		in = *w.last
		in.Epoch = epoch
	case p == 1 && w.last != nil && w.last.Resource == res && w.last.Kind == "file":
		// The same operation id with different content: must be refused.
		in = *w.last
		in.Epoch = epoch
		in.Payload = json.RawMessage(fmt.Sprintf(`{"target":%q,"content":"CONFLICT %s"}`, res+".txt", in.OperationID))
		reuse = true
	case p < 8:
		w.seq++
		// Six business keys per resource and 10 s generation (one clock
		// for all workers): the workers share each key, and new keys keep
		// coming, so late and lost replies meet first sends all run long.
		slot := w.rng.IntN(6)
		key := fmt.Sprintf("%s/mail/%d/%d", res, Mono()/int64(10*time.Second), slot)
		in = outbox.Intent{Resource: res, Epoch: epoch, OperationID: fmt.Sprintf("%s-%d", w.id, w.seq), Kind: "email",
			IdempotencyKey: key,
			// Deterministic per key: the same business key always carries
			// the same content, whoever enqueues it.
			Payload: json.RawMessage(fmt.Sprintf(`{"to":"ops@example.com","from":"chaos@example.com","subject":"report %s","text":"slot %d"}`, key, slot))}
	case p < 14 && w.hook != "":
		w.seq++
		// Webhook keys are shared like the email keys. Even slots name a
		// lookup_url (an unknown outcome is looked up), odd ones do not (it
		// is held for an operator).
		slot := w.rng.IntN(6)
		key := fmt.Sprintf("%s/hook/%d/%d", res, Mono()/int64(10*time.Second), slot)
		lookup := ""
		if slot%2 == 0 {
			lookup = fmt.Sprintf(`,"lookup_url":%q`, w.hook+"/lookup?key="+url.QueryEscape(key))
		}
		in = outbox.Intent{Resource: res, Epoch: epoch, OperationID: fmt.Sprintf("%s-%d", w.id, w.seq), Kind: "webhook",
			IdempotencyKey: key,
			Payload:        json.RawMessage(fmt.Sprintf(`{"url":%q,"body":{"key":%q,"slot":%d}%s}`, w.hook+"/hook", key, slot, lookup))}
	default:
		w.seq++
		op := fmt.Sprintf("%s-%d", w.id, w.seq)
		in = outbox.Intent{Resource: res, Epoch: epoch, OperationID: op, Kind: "file", IdempotencyKey: res + "/file/" + op,
			Payload: json.RawMessage(fmt.Sprintf(`{"target":%q,"content":"epoch %d by %s op %s"}`, res+".txt", epoch, w.id, op))}
	}
	o := Op{Kind: "enqueue", Resource: res, Holder: w.holder, Epoch: epoch, OpID: in.OperationID, IntentKnd: in.Kind,
		Key: in.IdempotencyKey, Payload: string(in.Payload), Reuse: reuse, Call: Mono()}
	c, cancel := opCtx()
	r, err := w.ob.Enqueue(c, in)
	cancel()
	o.Ret, o.Result = Mono(), classify(err)
	var se *outbox.StaleEpochError
	if errors.As(err, &se) {
		o.OutEpoch = se.Current
	}
	if err == nil {
		o.IntentID, o.Duplicate = r.IntentID, r.Duplicate
		if !r.Duplicate {
			cp := in
			w.last = &cp
		}
	} else if o.Result == "unknown" || o.Result == "error" {
		o.Err = err.Error()
	}
	w.record(o)
}
