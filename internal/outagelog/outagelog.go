// Package outagelog decides the level of a retrying loop's failure line,
// so that an outage of PostgreSQL or NATS is said in a few lines, not one
// per retry: WARN for the first failure and for a failure of another kind
// than the last, DEBUG while the same failure repeats; Recovered reports
// the first success after failures, to be said at INFO.
package outagelog

import (
	"log/slog"
	"sync"
)

// State is one loop's (or one set of concurrent calls') outage. The zero
// value is ready; it is safe for concurrent use.
type State struct {
	mu      sync.Mutex
	failing bool
	kind    string
	n       int
}

// Failed records a failure of kind (what tells outages apart: a SQLSTATE,
// an error's text; "" for one kind only) and returns the level to log it
// at and how many failures in a row this is.
func (s *State) Failed(kind string) (slog.Level, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	level := slog.LevelDebug
	if !s.failing || kind != s.kind {
		level = slog.LevelWarn
	}
	s.failing, s.kind = true, kind
	s.n++
	return level, s.n
}

// Recovered records a success and reports whether it ends failures.
func (s *State) Recovered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.failing
	s.failing, s.kind, s.n = false, "", 0
	return was
}

// Kind is the kind of the failure that last failed, "" when not failing.
func (s *State) Kind() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kind
}
