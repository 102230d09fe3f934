package lease

import (
	"fmt"
	"time"
)

// PauseStats summarises what a Keeper's pause detector has seen.
type PauseStats struct {
	// Samples is the number of ticks measured.
	Samples int64
	// Max is the longest pause seen.
	Max time.Duration
	// Last is the most recent pause longer than the PauseTick (a tick that
	// took over twice as long as asked: a pause, not scheduling jitter),
	// and LastAt when it ended (monotonic-bearing time.Now reading).
	Last   time.Duration
	LastAt time.Time
}

// Pauses returns what the pause detector has seen so far.
func (k *Keeper) Pauses() PauseStats {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.pauses
}

// MaxPause returns the longest pause the Keeper's detector has seen.
func (k *Keeper) MaxPause() time.Duration { return k.Pauses().Max }

// LastPause returns the most recent pause longer than the PauseTick, or 0.
func (k *Keeper) LastPause() time.Duration { return k.Pauses().Last }

// watchPauses is the pause detector: it sleeps PauseTick at a time and
// measures on the monotonic clock how much longer each sleep took. While
// the process is stopped nothing runs, so the first tick after it resumes
// carries the whole pause.
func (k *Keeper) watchPauses(last time.Time) {
	tick := k.cfg.PauseTick
	logAbove := time.Duration(float64(k.cfg.TTL) * k.cfg.PauseLogFraction)
	t := time.NewTimer(max(tick-time.Since(last), 0))
	defer t.Stop()
	for {
		select {
		case <-k.ctx.Done():
			// The renew loop may have cancelled first, woken by the same
			// pause: still record it, so the pause is never missed.
			if now := time.Now(); now.Sub(last) > 2*tick {
				k.recordPause(now, now.Sub(last)-tick)
			}
			return
		case <-t.C:
		}
		now := time.Now()
		pause := max(now.Sub(last)-tick, 0)
		last = now
		t.Reset(tick)
		l, trusted := k.recordPause(now, pause)
		if pause <= logAbove {
			continue
		}
		left := trusted.Sub(now)
		k.cfg.Logger.Warn("lease: keeper: process pause detected",
			"resource", l.Resource, "holder", l.Holder, "epoch", l.Epoch,
			"pause", pause, "pause_seconds", pause.Seconds(), "ttl", k.cfg.TTL, "trust_left", left)
		// The renew loop's deadline timer cancels the context too, but only
		// once its goroutine is scheduled; whichever runs first after the
		// pause cancels, so no caller sees a live context for longer.
		if left <= 0 {
			k.lose(fmt.Errorf("process paused for %s, past the lease's trust deadline", pause.Round(time.Millisecond)))
			return
		}
	}
}

// recordPause records one sample and returns the lease and the trust
// deadline as they are now.
func (k *Keeper) recordPause(now time.Time, pause time.Duration) (Lease, time.Time) {
	k.pauseHist.Observe(pause.Seconds())
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pauses.Samples++
	k.pauses.Max = max(k.pauses.Max, pause)
	if pause > k.cfg.PauseTick {
		k.pauses.Last, k.pauses.LastAt = pause, now
	}
	return k.lease, k.lastOK.Add(k.cfg.TTL - k.cfg.Margin)
}
