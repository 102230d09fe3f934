package startstop

import "sync"

// Group is a set of started parts, in start order: a composition root (the
// gateway, gateway dev) starts its parts one after another, adding each
// once it runs, and StopAll stops them in reverse — what started last,
// and so depends on the others, stops first. A part added with a Stopped
// channel is watched: if it stops before StopAll, Died is closed and
// Cause names it (the first such part). A Group's zero value is ready to
// use; it is safe for concurrent use.
type Group struct {
	mu       sync.Mutex
	parts    []part
	stopping chan struct{}
	died     chan struct{}
	cause    string
	stopped  bool // StopAll was called
	stopOnce sync.Once
}

// part is one started part of a Group.
type part struct {
	name string
	stop func()
}

// init makes the channels; under mu.
func (g *Group) init() {
	if g.stopping == nil {
		g.stopping, g.died = make(chan struct{}), make(chan struct{})
	}
}

// Add records a started part: stop stops it and returns once it has
// stopped; stopped (nil: not watched) is closed when it stops, on its own
// or by stop. A part added after StopAll is stopped at once: nothing is
// left running by a start that raced a stop.
func (g *Group) Add(name string, stop func(), stopped <-chan struct{}) {
	g.mu.Lock()
	g.init()
	if g.stopped {
		g.mu.Unlock()
		stop()
		return
	}
	g.parts = append(g.parts, part{name: name, stop: stop})
	stopping := g.stopping
	g.mu.Unlock()
	if stopped == nil {
		return
	}
	go func() {
		select {
		case <-stopped:
		case <-stopping:
			return
		}
		select {
		case <-stopping:
			// Stopped by StopAll, racing this watcher: expected.
		default:
			g.die(name)
		}
	}()
}

// die records the first part that stopped on its own.
func (g *Group) die(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cause != "" {
		return
	}
	g.cause = name
	close(g.died)
}

// StopAll stops every part in the reverse of the order they were added and
// returns once they have stopped. Safe to call more than once and
// concurrently: later calls wait for nothing.
func (g *Group) StopAll() {
	g.stopOnce.Do(func() {
		g.mu.Lock()
		g.init()
		g.stopped = true
		close(g.stopping)
		parts := g.parts
		g.mu.Unlock()
		for i := len(parts) - 1; i >= 0; i-- {
			parts[i].stop()
		}
	})
}

// Died is closed when a watched part stopped before StopAll was called.
func (g *Group) Died() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	return g.died
}

// Cause names the first part that stopped before StopAll, or "".
func (g *Group) Cause() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cause
}

// Names are the parts' names in start order.
func (g *Group) Names() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := make([]string, len(g.parts))
	for i, p := range g.parts {
		names[i] = p.name
	}
	return names
}
