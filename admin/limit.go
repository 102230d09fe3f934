package admin

import (
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/fencegate/fencegate/internal/errmap"
)

// Failed authentications are limited per client address: after
// Config.AuthFailureLimit failures from one address within
// Config.AuthFailureWindow (counted from the first of them), every request
// from it that needs a token — the API, /metrics, the pages, POST /login —
// is answered 429 with Retry-After until the window has passed, before any
// token is looked up. A failure is an unknown bearer token (API and pages)
// or a refused sign-in (an unknown token or one that is not an
// operator's: the form does not say which, and neither does the limiter).
// A missing token is not a failure: it is no guess.
//
// The address is the connection's, never a header (X-Forwarded-For could
// be written by the guesser): behind a proxy every client shares the
// proxy's address, and one guesser there limits all of them. IPv6 clients
// are counted per /64, which one host is usually given whole.
const (
	// DefaultAuthFailureLimit is Config.AuthFailureLimit's default.
	DefaultAuthFailureLimit = 10
	// DefaultAuthFailureWindow is Config.AuthFailureWindow's default.
	DefaultAuthFailureWindow = time.Minute
	// maxTrackedAddrs bounds the limiter's memory: past it, windows that
	// have ended are forgotten first, then arbitrary addresses.
	maxTrackedAddrs = 100_000
)

// failureLimiter counts failed authentications per client address.
type failureLimiter struct {
	max    int
	window time.Duration
	now    func() time.Time

	mu     sync.Mutex
	byAddr map[netip.Prefix]*failures
}

type failures struct {
	first time.Time
	n     int
}

func newFailureLimiter(max int, window time.Duration) *failureLimiter {
	return &failureLimiter{max: max, window: window, now: time.Now, byAddr: map[netip.Prefix]*failures{}}
}

// clientKey is the address a request is counted under: its connection's
// IPv4 address, or the /64 of its IPv6 address. A RemoteAddr that does not
// parse (a Unix socket) counts under the zero prefix.
func clientKey(r *http.Request) netip.Prefix {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Prefix{}
	}
	a := ap.Addr().Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// wait returns how long key must wait before it may try again; zero when
// it may try now.
func (l *failureLimiter) wait(key netip.Prefix) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.byAddr[key]
	if !ok {
		return 0
	}
	left := f.first.Add(l.window).Sub(l.now())
	if left <= 0 {
		delete(l.byAddr, key)
		return 0
	}
	if f.n < l.max {
		return 0
	}
	return left
}

// fail counts a failure of key and returns the failures of its window so
// far.
func (l *failureLimiter) fail(key netip.Prefix) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	f, ok := l.byAddr[key]
	if ok && !now.Before(f.first.Add(l.window)) {
		ok = false
	}
	if !ok {
		if len(l.byAddr) >= maxTrackedAddrs {
			l.forget(now)
		}
		f = &failures{first: now}
		l.byAddr[key] = f
	}
	f.n++
	return f.n
}

// forget drops the windows that have ended and, if that is not enough,
// arbitrary others, until there is room for one more address.
func (l *failureLimiter) forget(now time.Time) {
	for k, f := range l.byAddr {
		if !now.Before(f.first.Add(l.window)) {
			delete(l.byAddr, k)
		}
	}
	for k := range l.byAddr {
		if len(l.byAddr) < maxTrackedAddrs {
			return
		}
		delete(l.byAddr, k)
	}
}

// retryAfter is the Retry-After header's value for a wait: whole seconds,
// rounded up, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}

// limitWait is how long r's address must wait before it may authenticate
// again; zero when it may now. Only a server with tokens limits.
func (s *Server) limitWait(r *http.Request) time.Duration {
	if len(s.cfg.Tokens) == 0 {
		return 0
	}
	return s.limiter.wait(clientKey(r))
}

// limited answers 429 (JSON, for the API) when r's address is limited,
// and reports whether it did; the caller then stops.
func (s *Server) limited(w http.ResponseWriter, r *http.Request) bool {
	d := s.limitWait(r)
	if d <= 0 {
		return false
	}
	e := errmap.New(errmap.TooManyFailures, "too many failed authentications from this address: retry after "+retryAfter(d)+" s")
	e.RetryAfter = max(1, int((d+time.Second-1)/time.Second))
	writeError(w, e)
	return true
}

// authFailed counts and logs a failed authentication: the address, the
// path and why, never the token presented.
func (s *Server) authFailed(r *http.Request, why string) {
	n := s.limiter.fail(clientKey(r))
	attrs := []any{"remote", r.RemoteAddr, "path", r.URL.Path, "reason", why, "failures", n}
	if n == s.cfg.AuthFailureLimit {
		s.cfg.Logger.Warn("admin: authentication failed; the address is limited until its window ends", append(attrs, "window", s.cfg.AuthFailureWindow)...)
		return
	}
	s.cfg.Logger.Warn("admin: authentication failed", attrs...)
}
