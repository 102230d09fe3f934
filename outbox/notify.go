package outbox

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/pgschema"
)

// notifyTimeout bounds one trailing NOTIFY.
const notifyTimeout = 5 * time.Second

// notifier coalesces the NOTIFYs that wake dispatchers.
//
// Why: PostgreSQL queues a notification at commit under a global lock
// (NotifyQueueLock), so a NOTIFY in every enqueue serialises concurrent
// commits; measured at 16 goroutines it cost about a third of the enqueue
// rate. A dispatcher needs one wake-up, not one per intent: it claims every
// pending intent by status (never past a high-water mark) and claims again
// while batches come back full.
//
// How: claim grants the NOTIFY to at most one transaction per window. A
// transaction that went without one reports its commit with suppressed,
// which arms a timer; when it fires, one standalone
// `SELECT pg_notify('fencegate_intents', ”)` (the schema's intents channel) goes out for all the commits
// reported meanwhile. So a busy Client sends about two NOTIFYs per window
// instead of one per intent, and an idle one still notifies at once.
//
// Why no intent is lost: every committed intent is followed by a
// notification sent after its commit — its own (delivered at commit), or
// the trailing one, which is sent only after suppressed was called, that is
// after the enqueue's commit returned — so a listening dispatcher is woken
// within about one window of every commit. And nothing depends on a
// notification at all: a dispatcher also polls every PollInterval, which
// covers a trailing NOTIFY that failed or was never sent (this process died
// between the commit and the timer), and a dispatcher that was not
// listening at that moment. Coalescing changes how soon an intent is
// relayed, never whether.
type notifier struct {
	pool     *pgxpool.Pool
	channel  string // the schema's intents channel (pgschema)
	window   time.Duration
	disabled bool
	log      func(msg string, args ...any)

	mu sync.Mutex
	// last is when a transaction was last granted a NOTIFY, or when the
	// last trailing one was sent.
	last time.Time
	// pending: a commit without NOTIFY since the trailing timer last fired.
	pending bool
	armed   bool
}

func newNotifier(pool *pgxpool.Pool, cfg Config) *notifier {
	return &notifier{pool: pool, channel: pgschema.MustParse(cfg.Schema).IntentsChannel(), window: cfg.NotifyWindow, disabled: cfg.DisableNotify, log: cfg.Logger.Warn}
}

// claim reports whether the transaction about to run should NOTIFY.
func (n *notifier) claim() bool {
	if n.disabled {
		return false
	}
	if n.window < 0 {
		return true
	}
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.last.IsZero() || now.Sub(n.last) >= n.window {
		n.last = now
		return true
	}
	return false
}

// suppressed records that a transaction which may have committed an intent
// went without a NOTIFY; call it after that commit. A trailing NOTIFY
// follows within the window.
func (n *notifier) suppressed() {
	if n.disabled {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pending = true
	if !n.armed {
		n.armed = true
		time.AfterFunc(n.window, n.fire)
	}
}

// fire sends the trailing NOTIFY for the commits reported since it was
// armed.
func (n *notifier) fire() {
	n.mu.Lock()
	send := n.pending
	n.pending, n.armed = false, false
	if send {
		n.last = time.Now()
	}
	n.mu.Unlock()
	if !send {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
	defer cancel()
	if _, err := n.pool.Exec(ctx, `SELECT pg_notify($1, '')`, n.channel); err != nil {
		// The dispatchers' polling picks these intents up.
		n.log("outbox: trailing notify failed; dispatchers will find the intents by polling", "component", "outbox", "error", err)
	}
}
