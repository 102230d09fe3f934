package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// OutcomeChannel is the channel PostgreSQL notifies (with an empty
// payload) when a transaction gives intents a final status
// (migrations/functions/outcome_notify.sql, the intents' outcome
// trigger): "<schema>_outcomes",
// fencegate_outcomes in the default schema.
func (c *Client) OutcomeChannel() string { return c.schema.OutcomesChannel() }

// waitRecheck is how often the waiters re-read their intents without a
// notification: a safety net, since notifications sent while the listener
// reconnects are lost; it bounds how late such an outcome is seen.
const waitRecheck = 10 * time.Second

// waitPoll is how often a waiter re-reads its intent when the client does
// not LISTEN (Config.DisableListen).
const waitPoll = time.Second

// Wait returns the intent once it has a final status (Status.Terminal), or
// when ctx ends, with the intent as it is then and ctx's error. It is woken
// by PostgreSQL's notification of outcomes: the client keeps one LISTEN
// connection while anyone waits, whatever the number of waiters, and a
// notification (one per transaction that completed intents) has each
// waiter re-read its intent; without any, a waiter re-reads every 10 s, in
// case a notification was lost while the listener reconnected. With
// Config.DisableListen it re-reads every second instead.
// ErrNotFound when there is no such intent.
func (c *Client) Wait(ctx context.Context, intentID int64) (*Record, error) {
	// current is the intent as it is when the wait ends early: read even
	// though ctx is done (briefly), so the caller learns where it stands.
	current := func() (*Record, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		rec, err := c.Get(rctx, intentID)
		switch {
		case err != nil:
			return nil, err
		case rec.Status.Terminal():
			return rec, nil // it made it, just in time
		}
		return rec, context.Cause(ctx)
	}
	w := c.waiters()
	wake, leave, err := w.join(ctx, intentID)
	if err != nil {
		if ctx.Err() != nil {
			return current()
		}
		return nil, err
	}
	defer leave()
	var poll <-chan time.Time
	if w.poll {
		t := time.NewTicker(waitPoll)
		defer t.Stop()
		poll = t.C
	}
	// Read after joining: an outcome committed between this read and the
	// wait still wakes us (the listener was LISTENing before we read).
	for {
		rec, err := c.Get(ctx, intentID)
		switch {
		case err != nil && ctx.Err() != nil:
			return current()
		case err != nil:
			return nil, err
		case rec.Status.Terminal():
			return rec, nil
		}
		select {
		case <-wake:
		case <-poll:
		case <-ctx.Done():
			// Read again: rec may be a second (polling) or 10 s
			// (listening, a notification lost) old.
			return current()
		}
	}
}

// waitSet is the client's waiters and its one listener.
type waitSet struct {
	pool    *pgxpool.Pool
	channel string // the schema's outcomes channel
	log     func(msg string, args ...any)
	// poll: no listener (Config.DisableListen); each waiter re-reads on
	// its own timer.
	poll bool

	mu      sync.Mutex
	byID    map[int64]map[chan struct{}]bool
	n       int
	stop    context.CancelFunc // the listener's, while there are waiters
	done    chan struct{}      // closed when that listener has exited
	ready   chan struct{}      // closed once it is LISTENing
	lastErr error
}

func (c *Client) waiters() *waitSet {
	c.waitOnce.Do(func() {
		pool := c.pool
		if c.cfg.ListenPool != nil {
			pool = c.cfg.ListenPool
		}
		c.wait = &waitSet{pool: pool, channel: c.OutcomeChannel(), log: c.cfg.Logger.Warn,
			poll: c.cfg.DisableListen && c.cfg.ListenPool == nil, byID: map[int64]map[chan struct{}]bool{}}
	})
	return c.wait
}

// join registers a waiter for id and returns its wake channel, once the
// listener is LISTENing (or failed to, then an error).
func (w *waitSet) join(ctx context.Context, id int64) (chan struct{}, func(), error) {
	wake := make(chan struct{}, 1)
	w.mu.Lock()
	if w.byID[id] == nil {
		w.byID[id] = map[chan struct{}]bool{}
	}
	w.byID[id][wake] = true
	w.n++
	if w.poll {
		w.mu.Unlock()
		return wake, w.leaver(id, wake), nil
	}
	if w.stop == nil {
		lctx, cancel := context.WithCancel(context.Background())
		w.stop, w.done, w.ready = cancel, make(chan struct{}), make(chan struct{})
		go w.listen(lctx, w.done, w.ready)
	}
	ready := w.ready
	w.mu.Unlock()
	leave := w.leaver(id, wake)
	select {
	case <-ready:
		return wake, leave, nil
	case <-ctx.Done():
		leave()
		return nil, nil, context.Cause(ctx)
	}
}

// leaver returns the function that unregisters waiter wake of id, and
// stops the listener when it was the last.
func (w *waitSet) leaver(id int64, wake chan struct{}) func() {
	return func() {
		w.mu.Lock()
		delete(w.byID[id], wake)
		if len(w.byID[id]) == 0 {
			delete(w.byID, id)
		}
		w.n--
		var done chan struct{}
		if w.n == 0 && w.stop != nil {
			// The last waiter leaves: so does the listener, and its
			// connection goes back.
			w.stop()
			done, w.stop = w.done, nil
		}
		w.mu.Unlock()
		if done != nil {
			<-done
		}
	}
}

// wakeAll wakes every waiter (they re-read their intents).
func (w *waitSet) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, set := range w.byID {
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default: // a wake is pending already
			}
		}
	}
}

// listen holds one connection LISTENing on the outcomes channel until ctx ends,
// waking the waiters on every notification and every waitRecheck, and
// reconnecting after a failure (waking them then too: notifications sent
// meanwhile are lost).
func (w *waitSet) listen(ctx context.Context, done, ready chan struct{}) {
	defer close(done)
	readyOnce := sync.OnceFunc(func() { close(ready) })
	defer readyOnce() // a listener that never got going still lets join return
	for ctx.Err() == nil {
		err := w.listenOnce(ctx, readyOnce)
		if ctx.Err() != nil {
			return
		}
		w.log("outbox: waiting for outcomes: listen failed; re-reading meanwhile", "error", err)
		readyOnce() // the waiters go on, re-reading on the timer below
		w.wakeAll()
		t := time.NewTimer(waitRecheck)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (w *waitSet) listenOnce(ctx context.Context, ready func()) error {
	c, err := w.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	// The connection leaves the pool: it is LISTENing, and handing it to
	// someone else would deliver them our notifications.
	conn := c.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// The channel is a checked identifier (pgschema): no quoting needed.
	if _, err := conn.Exec(ctx, "LISTEN "+w.channel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// LISTENing from here: every waiter that joined reads after this.
	ready()
	for {
		wctx, cancel := context.WithTimeout(ctx, waitRecheck)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			// No notification for a while: re-read anyway (bounds how
			// late an outcome whose notification was lost is seen).
		default:
			return fmt.Errorf("wait for notification: %w", err)
		}
		w.wakeAll()
	}
}
