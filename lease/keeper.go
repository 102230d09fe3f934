package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/internal/startstop"
)

// ErrLeaseLost is the cause of a Keeper's context when the lease can no
// longer be trusted.
var ErrLeaseLost = errors.New("lease lost")

// KeeperConfig configures a Keeper.
type KeeperConfig struct {
	// TTL is the lease's time to live, as granted. Required.
	TTL time.Duration
	// RenewEvery is the renewal interval. Default: TTL/3.
	RenewEvery time.Duration
	// Margin is how long before the lease's expiry the Keeper stops
	// trusting it, to absorb clock rate differences and scheduling delay.
	// Default: TTL/10.
	Margin time.Duration
	// Logger receives renew failures, lost leases and long pauses. Nil:
	// discard.
	Logger *slog.Logger

	// PauseTick is the pause detector's interval: a goroutine asks to wake
	// up every PauseTick and measures, on the monotonic clock, how much
	// later it actually woke (jHiccup's method). The excess is a pause the
	// whole process suffered: GC, CPU starvation, swapping, SIGSTOP, a VM
	// freeze. Default: 10ms. Negative: no pause detection.
	PauseTick time.Duration
	// PauseLogFraction: a pause longer than this fraction of the TTL is
	// logged (warn) with its length. Default: 0.25.
	PauseLogFraction float64
	// Registerer receives fencegate_worker_pause_seconds, the histogram of
	// the pause detector's samples. Several Keepers may share it (each
	// records its own samples). Nil: not exported.
	Registerer prometheus.Registerer
}

// WithDefaults returns c with zero fields set to their defaults.
func (c KeeperConfig) WithDefaults() KeeperConfig {
	c.RenewEvery = cmp.Or(c.RenewEvery, c.TTL/3)
	c.Margin = cmp.Or(c.Margin, c.TTL/10)
	c.PauseTick = cmp.Or(c.PauseTick, 10*time.Millisecond)
	c.PauseLogFraction = cmp.Or(c.PauseLogFraction, 0.25)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// validate checks c, defaults applied. An error is a *fenceerr.InvalidError
// naming the Go field (TTL, RenewEvery, Margin, PauseLogFraction), each
// judged by its own rule: Margin before RenewEvery, whose bound depends on
// it, so that a bad Margin is reported as Margin.
func (c KeeperConfig) validate() error {
	if c.TTL < MinTTL || c.TTL > MaxTTL {
		return &InvalidError{Field: "TTL", Message: fmt.Sprintf("must be between %s and %s, got %s", MinTTL, MaxTTL, c.TTL)}
	}
	if c.Margin < 0 || c.Margin >= c.TTL {
		return &InvalidError{Field: "Margin", Message: fmt.Sprintf("must be at least 0 and below TTL (%s), got %s", c.TTL, c.Margin)}
	}
	if c.RenewEvery <= 0 || c.RenewEvery >= c.TTL-c.Margin {
		return &InvalidError{Field: "RenewEvery", Message: fmt.Sprintf("must be positive and below TTL-Margin (%s), got %s", c.TTL-c.Margin, c.RenewEvery)}
	}
	if c.PauseLogFraction < 0 {
		return &InvalidError{Field: "PauseLogFraction", Message: fmt.Sprintf("must be positive, got %g", c.PauseLogFraction)}
	}
	return nil
}

// Keeper keeps a lease renewed in the background and cancels its context as
// soon as the lease can no longer be trusted.
//
// Trust is judged by Go's monotonic clock: the lease is trusted until
// TTL-Margin has passed since the start of the last successful renewal (or of
// the Acquire that granted it). The start, not the end, because PostgreSQL
// set the expiry at some moment after the request left. Wall-clock time is
// never consulted, so a clock step cannot extend a lease.
//
// A Keeper narrows the window in which a paused worker acts on a lost lease;
// it cannot close it. A process that is paused right after checking its
// context and before writing will still write late. Only the destination's
// epoch check (outbox.Enqueue, the file adapter's fence) rejects that write:
// always pass the lease's epoch along with every side effect.
//
// A Keeper also watches for process pauses (see KeeperConfig.PauseTick):
// they are what turns a healthy worker into a fenced-out one, and their
// histogram is what to size a lease's TTL by.
type Keeper struct {
	issuer *Issuer
	cfg    KeeperConfig

	// life is the Keeper's lifecycle: Stop cancels its context (cause
	// startstop.ErrStopped) and waits for every goroutine in wg. ctx is a
	// child of it that lose cancels with the loss's cause; either way ctx
	// ends, and context.Cause(ctx) keeps whichever came first.
	life startstop.Lifecycle
	ctx  context.Context
	lost context.CancelCauseFunc
	wg   sync.WaitGroup

	mu     sync.Mutex
	lease  Lease
	lastOK time.Time // monotonic reading at the start of the last successful grant/renewal
	// capAt, until the first successful renewal, ends the trust sooner
	// than lastOK+TTL-Margin: the lease given to Keep expires sooner than
	// TTL after its grant (zero: no cap).
	capAt time.Time
	// firstRenew is when the first renewal is due: RenewEvery after the
	// grant, or sooner with capAt. Set before the loop starts.
	firstRenew time.Time
	pauses     PauseStats
	lostOnce   sync.Once

	pauseHist prometheus.Histogram
}

// Hold acquires a lease and starts a Keeper for it. The returned Keeper's
// Context is cancelled when the lease is lost or the Keeper stopped.
//
// Hold calls Acquire once, for the initial grant, so it always starts with
// a new epoch (also when holder still holds a live lease, e.g. a worker loop
// calling Hold again after its Keeper lost the lease: the writes of the
// previous epoch are fenced out from then on). The Keeper extends the lease
// with Renew, which keeps the epoch.
func (i *Issuer) Hold(ctx context.Context, resource, holder string, cfg KeeperConfig) (*Keeper, error) {
	if err := i.usable(); err != nil {
		return nil, err
	}
	cfg, hist, err := cfg.prepare()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	l, err := i.Acquire(ctx, resource, holder, cfg.TTL)
	if err != nil {
		return nil, err
	}
	return i.keep(ctx, l, start, cfg, hist)
}

// Keep starts a Keeper for a lease acquired at grantedAt, a time.Now()
// reading taken just before the Acquire call (it must carry a monotonic
// reading; it does when it comes from time.Now). With ctx already done it
// starts nothing and returns ctx's error (so does Hold).
//
// The lease is trusted until cfg.TTL-Margin after grantedAt, and never past
// its own expiry: Keep reads, by PostgreSQL's clock (which set it), how
// long l.ExpiresAt is away, and while that ends sooner — a lease granted
// for less than cfg.TTL — the Keeper trusts it until then, less the
// Margin, and renews it (for cfg.TTL) halfway there. A lease without its
// resource, holder, epoch or expiry (a zero Lease) is a
// *fenceerr.InvalidError naming the field; PostgreSQL unreachable, the
// error.
func (i *Issuer) Keep(ctx context.Context, l Lease, grantedAt time.Time, cfg KeeperConfig) (*Keeper, error) {
	if err := firstErr(i.usable(), ValidateResource(l.Resource), validateHolder(l.Holder), validateEpoch(l.Epoch)); err != nil {
		return nil, err
	}
	if l.ExpiresAt.IsZero() {
		return nil, &InvalidError{Field: "expires_at", Message: "must be set: the lease as Acquire returned it"}
	}
	cfg, hist, err := cfg.prepare()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Before the query: PostgreSQL's now() comes later, so start plus what
	// it says is left ends no later than the lease does.
	start := time.Now()
	var left int64 // microseconds, by PostgreSQL's clock
	if err := i.pool.QueryRow(ctx, `SELECT (extract(epoch FROM $1::timestamptz - now()) * 1000000)::bigint`, l.ExpiresAt).Scan(&left); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, i.wrap(ctx, "keep: read the lease's time left", err)
	}
	return i.keepFor(ctx, l, grantedAt, cfg, hist, start, time.Duration(left)*time.Microsecond)
}

// keepFor is keep for a lease known to expire left after start (Keep):
// when that is sooner than cfg.TTL after grantedAt, the Keeper trusts it
// until start+left-Margin at most, and renews it halfway there, if its
// own schedule (RenewEvery after grantedAt) comes later.
func (i *Issuer) keepFor(parent context.Context, l Lease, grantedAt time.Time, cfg KeeperConfig, hist prometheus.Histogram, start time.Time, left time.Duration) (*Keeper, error) {
	var capAt, renewAt time.Time
	if start.Add(left).Before(grantedAt.Add(cfg.TTL)) {
		capAt = start.Add(left - cfg.Margin)
		renewAt = start.Add(max(left-cfg.Margin, 0) / 2)
	}
	return i.keepCapped(parent, l, grantedAt, cfg, hist, capAt, renewAt)
}

// prepare applies cfg's defaults, checks it and makes its pause histogram:
// Hold does so before it acquires, so that a bad configuration grants no
// epoch.
func (cfg KeeperConfig) prepare() (KeeperConfig, prometheus.Histogram, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return cfg, nil, err
	}
	hist, err := newPauseHistogram(cfg.Registerer)
	return cfg, hist, err
}

func (i *Issuer) keep(parent context.Context, l Lease, start time.Time, cfg KeeperConfig, hist prometheus.Histogram) (*Keeper, error) {
	return i.keepCapped(parent, l, start, cfg, hist, time.Time{}, time.Time{})
}

// keepCapped starts a Keeper for l granted at start; capAt, when set, is
// the end of its trust before its first renewal (the lease's own expiry
// less the margin, Keep), and renewAt when that renewal is due at the
// latest.
func (i *Issuer) keepCapped(parent context.Context, l Lease, start time.Time, cfg KeeperConfig, hist prometheus.Histogram, capAt, renewAt time.Time) (*Keeper, error) {
	k := &Keeper{issuer: i, cfg: cfg, lease: l, lastOK: start, pauseHist: hist, capAt: capAt, firstRenew: start.Add(cfg.RenewEvery)}
	if !renewAt.IsZero() && renewAt.Before(k.firstRenew) {
		k.firstRenew = renewAt
	}
	ctx, err := k.life.Start(parent, "lease: keeper")
	if err != nil {
		return nil, err // parent already done
	}
	k.ctx, k.lost = context.WithCancelCause(ctx)
	// Every goroutine of the Keeper — the renew loop, the renewal it has in
	// flight, the pause detector — is in wg, and life.Done (which lets Stop
	// return and closes Stopped) waits for all of them: once Stop returns,
	// nothing of the Keeper still runs or talks to the database.
	k.wg.Add(1)
	go func() { defer k.wg.Done(); k.loop() }()
	if cfg.PauseTick > 0 {
		// The first tick counts from now, not from whenever the goroutine
		// first runs: a process stopped before then still shows its pause.
		now := time.Now()
		k.wg.Add(1)
		go func() { defer k.wg.Done(); k.watchPauses(now) }()
	}
	go func() {
		k.wg.Wait()
		k.lost(nil) // releases ctx's resources; a no-op on an ended ctx
		k.life.Done()
	}()
	return k, nil
}

// Context is cancelled, with cause ErrLeaseLost (wrapped), as soon as the
// lease can no longer be trusted; when the Keeper is stopped (the cause
// then matches context.Canceled); or when the context given to Hold or Keep
// ends (with its cause). A Keeper that Hold or Keep did not make (a zero
// Keeper{}) trusts no lease: its Context is done, its cause the
// *fenceerr.InvalidError that Err returns.
func (k *Keeper) Context() context.Context {
	if k.ctx == nil {
		return unstartedKeeper
	}
	return k.ctx
}

// errUnstartedKeeper is the cause of a Keeper's context when Hold or Keep
// did not make it: it keeps no lease, so it must never look live.
var errUnstartedKeeper = &InvalidError{Field: "keeper", Message: "keeps no lease: a Keeper is made by Issuer.Hold or Issuer.Keep"}

// unstartedKeeper is the Context of a Keeper that Hold or Keep did not
// make: done, with errUnstartedKeeper as its cause.
var unstartedKeeper = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errUnstartedKeeper)
	return ctx
}()

// Lease returns the lease as last renewed.
func (k *Keeper) Lease() Lease {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease
}

// Epoch returns the lease's epoch, to pass along with every side effect.
func (k *Keeper) Epoch() int64 { return k.Lease().Epoch }

// Err returns why the Keeper's context ended (its context.Cause), or nil
// while it is live: an error wrapping ErrLeaseLost for a lost lease, one
// matching context.Canceled after Stop, the parent's cause when the parent
// ended first. A Keeper that Hold or Keep did not make (a zero Keeper{})
// returns a *fenceerr.InvalidError naming keeper: it keeps no lease.
func (k *Keeper) Err() error { return context.Cause(k.Context()) }

// Stop stops renewing, cancels the context and waits until the Keeper's
// goroutines, a renewal in flight included, have exited. It does not
// release the lease; call Issuer.Release for that. Idempotent.
func (k *Keeper) Stop() { k.life.Stop() }

// Stopped is closed when the Keeper's goroutines have exited: after Stop,
// a lost lease, or the end of the context given to Hold or Keep.
func (k *Keeper) Stopped() <-chan struct{} { return k.life.Stopped() }

func (k *Keeper) trustedUntil() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	t := k.lastOK.Add(k.cfg.TTL - k.cfg.Margin)
	if !k.capAt.IsZero() && k.capAt.Before(t) {
		return k.capAt
	}
	return t
}

// lose cancels the context with ErrLeaseLost. Both the renew loop and the
// pause detector may call it; the first cause wins and is logged once.
func (k *Keeper) lose(err error) {
	k.lostOnce.Do(func() {
		if k.ctx.Err() != nil {
			return // stopped meanwhile: not a loss
		}
		l := k.Lease()
		k.cfg.Logger.Warn("lease: keeper: lease lost", "resource", l.Resource, "holder", l.Holder, "epoch", l.Epoch, "error", err)
		k.lost(fmt.Errorf("%w: %w", ErrLeaseLost, err))
	})
}

func (k *Keeper) loop() {
	// The first renewal is due RenewEvery after the grant, on the clock the
	// trust window runs on: timed from here instead, a grant that reached
	// the Keeper late (a slow Acquire, whose reading precedes its request,
	// or Keep long after it) would get its first renewal after its
	// deadline and lose a healthy lease. An overdue one starts at once.
	k.mu.Lock()
	first := time.Until(k.firstRenew)
	k.mu.Unlock()
	renew := time.NewTimer(max(first, 0))
	defer renew.Stop()
	// The trust deadline has its own timer, so the context is cancelled on
	// time even while a renew call is blocked on a slow database.
	deadline := time.NewTimer(time.Until(k.trustedUntil()))
	defer deadline.Stop()
	results := make(chan error, 1)
	renewing := false
	var started time.Time
	for {
		select {
		case <-k.ctx.Done():
			return
		case <-deadline.C:
			if time.Now().Before(k.trustedUntil()) { // renewed meanwhile
				deadline.Reset(time.Until(k.trustedUntil()))
				continue
			}
			k.lose(k.deadlineError())
			return
		case <-renew.C:
			if renewing {
				continue
			}
			renewing = true
			started = time.Now()
			l := k.Lease()
			// In wg, so Stop waits for it too. The loop itself is counted
			// in wg here, so this Add cannot come after wg.Wait returned.
			k.wg.Add(1)
			go func() {
				defer k.wg.Done()
				ctx, cancel := context.WithDeadline(k.ctx, k.trustedUntil())
				defer cancel()
				nl, err := k.issuer.Renew(ctx, l.Resource, l.Holder, l.Epoch, k.cfg.TTL)
				if err == nil {
					k.mu.Lock()
					// Renewed for TTL from started: the lease's own
					// shorter expiry no longer bounds the trust.
					k.lease, k.lastOK, k.capAt = nl, started, time.Time{}
					k.mu.Unlock()
				}
				results <- err
			}()
		case err := <-results:
			renewing = false
			if errors.Is(err, ErrStaleEpoch) {
				k.lose(err)
				return
			}
			next := k.cfg.RenewEvery
			if err != nil {
				if k.ctx.Err() != nil {
					return
				}
				k.cfg.Logger.Warn("lease: keeper: renew failed; retrying", "resource", k.Lease().Resource, "error", err)
				next = min(next, 100*time.Millisecond)
			} else {
				deadline.Reset(time.Until(k.trustedUntil()))
			}
			renew.Reset(next)
		}
	}
}

// deadlineError is the cause of a loss by the trust deadline.
func (k *Keeper) deadlineError() error {
	k.mu.Lock()
	capped := !k.capAt.IsZero() && k.capAt.Before(k.lastOK.Add(k.cfg.TTL-k.cfg.Margin))
	k.mu.Unlock()
	if capped {
		return fmt.Errorf("no successful renewal before the lease's own expiry (less the margin %s): it was granted for less than TTL %s", k.cfg.Margin, k.cfg.TTL)
	}
	return fmt.Errorf("no successful renewal within %s", k.cfg.TTL-k.cfg.Margin)
}
